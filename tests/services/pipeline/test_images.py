"""Images end to end: a real mmgate server in this process (so a test can reach into its media
pipeline), the real vLLM engine on the tiny LLaVA model, real gRPC over loopback; the session's
in-process server, which the tracing and health tests share."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
import pytest_asyncio
from google.rpc import error_details_pb2

from services.api.server import MmgateServer
from services.client import MmgateClient, build_request, digest_of
from services.pipeline.media import PixelsStage
from services.proto.mmgate.v1 import inference_pb2 as pb
from services.wire import TENANT_HEADER
from tests.services.statuses import error_details, violated_fields
from tests.support import eventually, run_cli

from ..imagegen import corrupt_png, large_png, png, png_bomb, variant
from ..prom import promtool_problems, scrape
from ..reentering import ReEntering

pytestmark = pytest.mark.asyncio(loop_scope="session")

IMAGE_TOKENS = 16  # 56x56 pixels in 14-pixel patches


@pytest.fixture
def server(embeddings_server: MmgateServer) -> MmgateServer:
    """The session's in-process server (tests/services/in_process.py)."""
    return embeddings_server


@pytest_asyncio.fixture(loop_scope="session")
async def client(server: MmgateServer) -> AsyncIterator[MmgateClient]:
    async with MmgateClient(f"127.0.0.1:{server.port}", timeout=60.0) as client:
        yield client


def ask(*images: bytes, text: str = "What is in the picture?") -> pb.GenerateRequest:
    return build_request(text, images=list(images), max_tokens=8, temperature=0.0)


async def test_the_server_says_it_caches_encoder_outputs(client: MmgateClient) -> None:
    stats = await client.stats()
    assert stats.media_mode == "embeddings"


async def test_one_decode_and_one_encode_for_two_requests_at_once(client: MmgateClient) -> None:
    data = png(101)
    before = (await client.stats()).media
    first, second = await asyncio.gather(
        client.complete_request(ask(data)), client.complete_request(ask(data))
    )
    after = (await client.stats()).media
    assert (after.decodes - before.decodes, after.encodes - before.encodes) == (1, 1)
    assert first.token_ids == second.token_ids
    assert first.text == second.text
    outcomes = sorted(r.cache.images[0].outcome for r in (first.final, second.final))
    assert outcomes == ["coalesced", "miss"]
    report = first.final.cache.images[0]
    assert report.digest == digest_of(data)
    assert report.form == "embeddings"
    # the image placeholder became the image's tokens in the engine
    assert first.final.usage.prompt_tokens > IMAGE_TOKENS

    third = await client.complete_request(ask(data))
    assert third.final.cache.images[0].outcome == "hit"
    assert third.final.cache.images[0].tier == "memory"
    assert third.token_ids == first.token_ids
    assert (await client.stats()).media.encodes == after.encodes


async def test_different_images_give_their_own_answers(client: MmgateClient) -> None:
    answers = [await client.complete_request(ask(png(seed))) for seed in (201, 202, 203)]
    digests = {a.final.cache.images[0].digest for a in answers}
    assert len(digests) == 3
    # random weights, but the image still steers the greedy answer
    assert len({tuple(a.token_ids) for a in answers}) > 1


async def test_a_reference_only_request(client: MmgateClient) -> None:
    data = png(301)
    sent = await client.complete_request(ask(data))
    by_digest = ask(data)
    by_digest.images[0].digest = digest_of(data)  # no bytes on the wire
    assert not by_digest.images[0].data
    again = await client.complete_request(by_digest)
    assert again.token_ids == sent.token_ids
    assert again.final.cache.images[0].outcome == "hit"


async def test_an_unknown_reference_is_not_found_with_a_reason(client: MmgateClient) -> None:
    request = ask(png(302))
    request.images[0].digest = digest_of(b"never sent")
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await client.complete_request(request)
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    [info] = [d for d in error_details(caught.value) if isinstance(d, error_details_pb2.ErrorInfo)]
    assert info.reason == "IMAGE_NOT_FOUND"
    assert info.metadata["digest"] == digest_of(b"never sent")
    assert info.metadata["index"] == "0"


async def test_the_client_resends_bytes_when_the_server_lost_the_image(
    client: MmgateClient,
) -> None:
    data = png(303)
    first = await client.complete_request(ask(data))
    digest = first.final.cache.images[0].digest
    assert digest in client.held  # the next request goes by reference
    assert await client.invalidate(digest=digest)
    before = (await client.stats()).media
    again = await client.complete_request(ask(data))
    after = (await client.stats()).media
    assert again.token_ids == first.token_ids
    assert after.not_held == before.not_held + 1  # the reference was refused...
    assert after.decodes == before.decodes + 1  # ...and the resent bytes decoded
    assert again.final.cache.images[0].outcome == "miss"


async def test_prefetch_inspect_invalidate_by_digest(client: MmgateClient) -> None:
    data = png(304)
    warmed = await client.prefetch(data)
    assert warmed.digest == digest_of(data)
    assert (warmed.outcome, warmed.form) == ("miss", "embeddings")
    seen = await client.inspect(digest=warmed.digest)
    assert seen.state == "stored"
    assert {s.stage: s.state for s in seen.stages} == {"image": "stored", "embedding": "stored"}
    request = ask(data)
    request.images[0].digest = warmed.digest
    answer = await client.complete_request(request)
    assert answer.final.cache.images[0].outcome == "hit"
    assert await client.invalidate(digest=warmed.digest)
    gone = await client.inspect(digest=warmed.digest)
    assert gone.state == "absent"


async def test_the_tenant_scopes_references(server: MmgateServer, client: MmgateClient) -> None:
    data = png(305)
    await client.complete_request(ask(data))
    async with MmgateClient(f"127.0.0.1:{server.port}", tenant="other", timeout=60) as other:
        request = ask(data)
        request.images[0].digest = digest_of(data)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await other.complete_request(request)
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND


@pytest.mark.parametrize(
    ("images", "text", "field"),
    [
        ([corrupt_png(1)], "<image> What?", "images[0]"),
        ([png(2), png_bomb()], "<image><image> What?", "images[1]"),
        ([png(3, size=(1, 1))], "<image> What?", "images[0]"),
        ([png(4)] * 100, "<image>" * 100, "images"),
        ([png(5), png(6)], "<image> What?", "chat.messages"),
        ([b"GIF89a" + b"\x00" * 32], "<image> What?", "images[0]"),
    ],
    ids=["corrupt", "zip-bomb", "one-pixel", "100-images", "placeholders", "gif"],
)
async def test_bad_images_get_invalid_argument_naming_the_image(
    client: MmgateClient, images: list[bytes], text: str, field: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await client.complete_request(ask(*images, text=text))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caught.value.details()
    assert field in violated_fields(caught.value)
    # the server keeps serving, and the refused image left nothing behind
    fine = await client.complete_request(ask(png(7)))
    assert fine.final.usage.completion_tokens > 0


async def test_a_miss_path_that_looks_the_image_up_again_fails_fast_as_internal(
    server: MmgateServer, client: MmgateClient
) -> None:
    """The failure mmgate exists for: the miss path re-enters the cache for the same image."""
    pipeline = server.pipeline
    media = pipeline.media
    assert isinstance(media, PixelsStage)
    data = png(401)
    pipeline.media = ReEntering(media.context)
    try:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await client.complete_request(ask(data), timeout=20.0)
    finally:
        pipeline.media = media
    assert caught.value.code() == grpc.StatusCode.INTERNAL
    assert "wait on itself" in (caught.value.details() or "")
    answer = await client.complete_request(ask(data))
    assert answer.final.cache.images[0].outcome == "miss"
    stats = await client.stats()
    assert stats.actor.recursion_rejections >= 1
    assert stats.actor.flights == 0


async def test_a_text_request_still_works_on_the_vision_model(client: MmgateClient) -> None:
    answer = await client.complete("Hello there", max_tokens=4, ignore_eos=True)
    assert answer.final.usage.completion_tokens == 4
    assert not answer.final.cache.images


async def test_a_shared_response_is_shared_only_for_the_same_image(client: MmgateClient) -> None:
    def same_question(data: bytes) -> pb.GenerateRequest:
        return build_request(
            "Describe it.", images=[data], max_tokens=6, temperature=0.0, cache_policy="response"
        )

    first = await client.complete_request(same_question(png(501)))
    again = await client.complete_request(same_question(png(501)))
    other = await client.complete_request(same_question(png(502)))
    assert not first.final.cache.response_from_cache
    assert again.final.cache.response_from_cache
    assert again.token_ids == first.token_ids
    # same text, same sampling, another image: generated afresh, never the first one's answer
    assert not other.final.cache.response_from_cache


async def test_prefetch_names_the_bad_field(client: MmgateClient) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await client.prefetch(corrupt_png(9))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert violated_fields(caught.value) == {"data"}


async def test_prefetch_names_a_bad_tenant_header_as_such(server: MmgateServer) -> None:
    async with MmgateClient(f"127.0.0.1:{server.port}", tenant="no spaces!", timeout=30) as bad:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await bad.prefetch(png(10))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert violated_fields(caught.value) == {TENANT_HEADER}


async def test_the_cli_sends_an_image_file_and_shows_the_mode(
    server: MmgateServer, tmp_path: Path
) -> None:
    picture = tmp_path / "picture.png"
    picture.write_bytes(png(601))
    target = f"127.0.0.1:{server.port}"
    answer = await run_cli(
        target, "generate", "What is this?", "--image", str(picture), "--max-tokens", "4"
    )
    assert answer.strip()
    table = await run_cli(target, "stats")
    assert "embeddings" in table


async def test_the_media_level_counts_a_miss_then_a_hit(
    server: MmgateServer, client: MmgateClient
) -> None:
    url = f"http://127.0.0.1:{server.metrics.port}/metrics"
    before = await scrape(url)
    data = png(701)
    await client.complete_request(ask(data))
    await client.complete_request(ask(data))
    after = await scrape(url)

    def moved(name: str, **labels: str) -> float:
        return after.value(name, **labels) - before.value(name, **labels)

    media = "mmgate_cache_media_lookups_total"
    # the first: the encoder output is missing, and the decoded image its computation asks for
    assert moved(media, tier="none", outcome="miss") == 2
    # the second: the encoder output, from memory
    assert moved(media, tier="memory", outcome="hit") == 1
    assert after.total(media) - before.total(media) == 3
    lookups = "mmgate_actor_lookups_total"
    assert moved(lookups, stage="embedding", outcome="miss", tier="none") == 1
    assert moved(lookups, stage="image", outcome="miss", tier="none") == 1
    assert moved(lookups, stage="embedding", outcome="hit", tier="memory") == 1
    assert (moved("mmgate_media_decodes_total"), moved("mmgate_media_encodes_total")) == (1, 1)
    served = after.total(media, outcome="hit") + after.total(media, outcome="coalesced")
    ratio = after.value("mmgate_cache_hit_ratio", level="media")
    assert ratio == pytest.approx(served / after.total(media))
    assert ratio > 0
    assert after.total("mmgate_info", media_mode="embeddings") == 1
    assert promtool_problems(after.text) == ""


BURST = 12


async def test_a_burst_of_large_images_does_not_hold_up_prompts(
    server: MmgateServer, client: MmgateClient
) -> None:
    """Decoding has its own threads: with one, twelve 36-megapixel images queue behind it while a
    text request's prompt is rendered in the render stage's threads meanwhile. (With one shared
    executor of six threads, the prompt waited behind six decodes.)"""
    base = large_png()
    images = [variant(base, 1000 + n) for n in range(BURST)]
    decodes_before = server.pipeline.media.stats.decodes
    burst = [asyncio.ensure_future(client.complete_request(ask(image))) for image in images]
    try:

        def decode_waiting() -> int:
            stats = {s.pool: s for s in server.pipeline.threads.stats()}
            return stats["decode"].waiting

        async def queued() -> bool:
            return decode_waiting() >= BURST // 2

        await eventually(queued, timeout=60, interval=0.01)
        url = f"http://127.0.0.1:{server.metrics.port}/metrics"
        scraped = await scrape(url)
        assert scraped.value("mmgate_stage_threads_waiting", stage="decode") >= 1
        assert scraped.value("mmgate_stage_threads", stage="decode") == 1

        text = await client.complete(f"Say hi {uuid.uuid4().hex}", max_tokens=2, temperature=0.0)
        decoded_meanwhile = server.pipeline.media.stats.decodes - decodes_before
        still_waiting = decode_waiting()
        assert text.final.usage.completion_tokens > 0
    finally:
        answers = await asyncio.gather(*burst, return_exceptions=True)
    assert all(not isinstance(a, BaseException) for a in answers), answers
    assert server.pipeline.media.stats.decodes - decodes_before == BURST
    # the prompt did not wait for the queue: most of the burst was still waiting when it was done
    assert decoded_meanwhile <= BURST // 2 - 1, decoded_meanwhile
    assert still_waiting >= 1
