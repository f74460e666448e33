"""Video end to end: two mmgate servers in this process on the tiny video model (a random-weight
Qwen2-VL built here, services/models/tiny_video.py) sharing a real redis-server, real vLLM
engines, real gRPC over loopback, and clips made here (tests/video_clips.py)."""

from __future__ import annotations

import asyncio
import http.server
import re
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import pytest
import pytest_asyncio
from google.rpc import error_details_pb2

from services.api.server import MmgateServer
from services.client import MmgateClient, build_request, digest_of
from services.config import Settings
from services.media_types import VideoSampling
from services.models.tiny_video import engine_settings
from services.pipeline.media.videos import VideoStage
from services.proto.mmgate.v1 import inference_pb2 as pb
from tests.redis_support import RedisProcess, redis_server
from tests.services.pipeline.vllm_video import vllm_answer
from tests.services.prom import promtool_problems, scrape
from tests.services.statuses import error_details, violated_fields
from tests.support import eventually, run_cli
from tests.video_clips import (
    fake_magic,
    huge_frames,
    million_frames,
    moving_shapes,
    not_a_video,
    truncated,
    zero_length,
)

pytestmark = pytest.mark.asyncio(loop_scope="session")

FRAMES = 8


def ask(
    video: bytes | str | pb.Video, *, text: str = "What happens here?", frames: int = FRAMES
) -> pb.GenerateRequest:
    if not isinstance(video, pb.Video):
        video = pb.Video(url=video) if isinstance(video, str) else pb.Video(data=video)
    video.num_frames = frames
    return build_request(text, videos=[video], max_tokens=8, temperature=0.0)


@pytest.fixture(scope="module")
def video_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisProcess]:
    server = redis_server(tmp_path_factory.mktemp("video-redis"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def clip_host() -> Iterator[tuple[str, dict[str, tuple[bytes, str]]]]:
    """A plain HTTP server on loopback: the clips a test puts in its table, by path."""
    served: dict[str, tuple[bytes, str]] = {}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            data, mime = served.get(self.path, (b"", ""))
            self.send_response(200 if data else 404)
            self.send_header("Content-Type", mime or "text/plain")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    host = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=host.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{host.server_address[1]}", served
    finally:
        host.shutdown()
        host.server_close()


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def replicas(
    tiny_video: Path, video_redis: RedisProcess
) -> AsyncIterator[tuple[MmgateServer, MmgateServer]]:
    settings = Settings(
        port=0,
        engine=engine_settings(tiny_video),
        # clips by URL from the loopback host above
        media={"url_schemes": ["http"], "url_allow": ["127.0.0.1/32"], "video_decode_seconds": 5},
        redis={"url": video_redis.url},
        metrics={"port": 0},
        max_concurrent_requests=32,
        health={"loop_block_seconds": 3600},
    )
    started: list[MmgateServer] = []
    try:
        for _ in range(2):
            server = MmgateServer(settings, model=str(tiny_video))
            started.append(server)
            await server.start()
        yield started[0], started[1]
    finally:
        for server in started:
            await server.stop(grace=5)


@pytest_asyncio.fixture(loop_scope="session")
async def client(
    replicas: tuple[MmgateServer, MmgateServer],
) -> AsyncIterator[MmgateClient]:
    async with MmgateClient(f"127.0.0.1:{replicas[0].port}", timeout=60.0) as client:
        yield client


async def decodes(server: MmgateServer) -> int:
    return server.pipeline.media.videos.stats.decodes


async def test_the_model_info_says_it_takes_video(client: MmgateClient) -> None:
    info = await client.model_info()
    assert info.takes_video
    assert info.takes_images
    assert info.video_mode == "pixels"
    assert info.limits.max_videos == 2
    assert info.limits.max_video_frames == 32


async def test_a_clip_gets_the_answer_vllm_gives_for_the_same_frames(
    client: MmgateClient, replicas: tuple[MmgateServer, MmgateServer]
) -> None:
    data = moving_shapes(frames=24, seed=1)
    answer = await client.complete_request(ask(data))
    assert answer.final.cache.videos[0].frames == FRAMES

    # vLLM on the same clip: its loader samples it, its engine encodes the frames
    tokens, prompt_tokens = await vllm_answer(replicas[0], data, FRAMES, "What happens here?")
    assert list(answer.token_ids) == tokens
    assert answer.final.usage.prompt_tokens == prompt_tokens


async def test_a_repeat_is_a_memory_hit_and_decodes_nothing(
    client: MmgateClient, replicas: tuple[MmgateServer, MmgateServer]
) -> None:
    data = moving_shapes(seed=2)
    first = await client.complete_request(ask(data))
    before = await decodes(replicas[0])
    second = await client.complete_request(ask(data))
    assert await decodes(replicas[0]) == before
    report = second.final.cache.videos[0]
    assert (report.outcome, report.tier, report.digest) == ("hit", "memory", digest_of(data))
    assert second.token_ids == first.token_ids

    # by reference: no bytes on the wire, the same frames
    by_digest = ask(pb.Video(digest=digest_of(data)))
    again = await client.complete_request(by_digest)
    assert again.final.cache.videos[0].outcome == "hit"
    assert again.token_ids == first.token_ids

    # other frames of the same clip are another entry, decoded once
    fewer = await client.complete_request(ask(data, frames=4))
    assert fewer.final.cache.videos[0].outcome == "miss"
    assert fewer.final.cache.videos[0].frames == 4
    assert await decodes(replicas[0]) == before + 1


async def test_an_unknown_reference_is_not_found_with_its_reason(client: MmgateClient) -> None:
    request = ask(pb.Video(digest=digest_of(b"never sent")))
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await client.complete_request(request)
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    [info] = [d for d in error_details(caught.value) if isinstance(d, error_details_pb2.ErrorInfo)]
    assert info.reason == "VIDEO_NOT_FOUND"
    assert info.metadata["index"] == "0"


async def test_sixteen_requests_with_one_new_clip_decode_it_once(
    client: MmgateClient, replicas: tuple[MmgateServer, MmgateServer]
) -> None:
    data = moving_shapes(seed=3)
    before = await decodes(replicas[0])
    answers = await asyncio.gather(*(client.complete_request(ask(data)) for _ in range(16)))
    assert await decodes(replicas[0]) == before + 1
    # one decoded it; the others joined it, or (arriving after it ended) found it stored
    outcomes = [a.final.cache.videos[0].outcome for a in answers]
    assert outcomes.count("miss") == 1
    assert set(outcomes) <= {"miss", "coalesced", "hit"}
    assert len({tuple(a.token_ids) for a in answers}) == 1


async def test_a_second_replica_answers_from_redis(
    client: MmgateClient, replicas: tuple[MmgateServer, MmgateServer]
) -> None:
    data = moving_shapes(seed=4)
    first = await client.complete_request(ask(data))
    # the write to Redis does not delay the answer: wait until it is there
    videos = replicas[0].pipeline.media.videos
    assert isinstance(videos, VideoStage)
    key = videos.key(digest_of(data), videos.sampling(VideoSampling(FRAMES)))
    tier = replicas[0].tier
    assert tier is not None

    async def written() -> bool:
        return await tier.get("default", key, stage="video", timeout=5) is not None

    await eventually(written, timeout=10)
    other = replicas[1]
    before = await decodes(other)
    async with MmgateClient(f"127.0.0.1:{other.port}", timeout=60.0) as second_client:
        second = await second_client.complete_request(ask(data))
    report = second.final.cache.videos[0]
    assert (report.outcome, report.tier) == ("miss", "redis")
    assert await decodes(other) == before
    assert second.token_ids == first.token_ids


async def test_another_tenants_clip_is_not_served_from_the_first_tenants_entry(
    replicas: tuple[MmgateServer, MmgateServer],
) -> None:
    data = moving_shapes(seed=5)
    target = f"127.0.0.1:{replicas[0].port}"
    async with (
        MmgateClient(target, tenant="tenant-a", timeout=60.0) as a,
        MmgateClient(target, tenant="tenant-b", timeout=60.0) as b,
    ):
        await a.complete_request(ask(data))
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await b.complete_request(ask(pb.Video(digest=digest_of(data))))
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND
        before = await decodes(replicas[0])
        own = await b.complete_request(ask(data))
    assert own.final.cache.videos[0].outcome == "miss"
    assert await decodes(replicas[0]) == before + 1


async def test_a_clip_by_url(
    client: MmgateClient, clip_host: tuple[str, dict[str, tuple[bytes, str]]]
) -> None:
    base, served = clip_host
    data = moving_shapes(seed=6)
    served["/clip.avi"] = (data, "video/x-msvideo")
    by_url = await client.complete_request(ask(f"{base}/clip.avi"))
    by_bytes = await client.complete_request(ask(data))
    assert by_url.final.cache.videos[0].digest == digest_of(data)
    assert by_bytes.final.cache.videos[0].outcome == "hit"
    assert by_url.token_ids == by_bytes.token_ids

    served["/page.html"] = (b"<html></html>", "text/html")
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await client.complete_request(ask(f"{base}/page.html"))
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "videos[0].url" in (caught.value.details() or "")


async def test_images_and_a_video_in_one_chat(client: MmgateClient) -> None:
    from tests.services.imagegen import png

    request = build_request(
        "<image> and <video>: the same?",
        images=[png(7)],
        videos=[pb.Video(data=moving_shapes(seed=7), num_frames=4)],
        max_tokens=4,
        temperature=0.0,
    )
    answer = await client.complete_request(request)
    assert len(answer.final.cache.images) == 1
    assert len(answer.final.cache.videos) == 1
    assert len(answer.token_ids) == 4


HOSTILE = {
    "truncated": lambda: truncated(moving_shapes(frames=32, seed=8)),
    "a million frames": million_frames,
    "huge frames": huge_frames,
    "no frames": zero_length,
    "not a video": not_a_video,
    "a fake header": fake_magic,
}


@pytest.mark.parametrize("name", list(HOSTILE))
async def test_a_hostile_clip_is_refused_in_mmgate_words_and_the_server_serves_on(
    client: MmgateClient, name: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await client.complete_request(ask(HOSTILE[name](), frames=32))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caught.value.details()
    assert violated_fields(caught.value) == {"videos[0]"}
    said = caught.value.details() or ""
    assert not re.search(r"\b0x[0-9a-fA-F]{6,}", said)  # no address of this process
    for hint in ("Error", "cv2", "Traceback", "/tmp"):
        assert hint not in said
    # still serving
    answer = await client.complete_request(ask(moving_shapes(seed=9)))
    assert answer.final.cache.videos[0].frames == FRAMES


async def test_bad_video_fields_are_invalid_argument(client: MmgateClient) -> None:
    cases = {
        "videos": build_request("hi", videos=[b"x"], raw=True, max_tokens=2),
        "chat.messages": build_request(
            "no placeholder", messages=[("user", "two <video><video>")], videos=[b"x"]
        ),
        "videos[0].num_frames": ask(moving_shapes(seed=10), frames=33),
        "videos[0].mime_type": ask(pb.Video(data=b"x", mime_type="video/ogg")),
        "videos[0].digest": ask(pb.Video(digest="sha256:nope")),
    }
    for field, request in cases.items():
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await client.complete_request(request)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, field
        assert field in violated_fields(caught.value), (field, caught.value.details())


async def test_the_cli_sends_a_clip_and_the_metrics_and_stats_count_it(
    replicas: tuple[MmgateServer, MmgateServer], tmp_path: Path
) -> None:
    server = replicas[0]
    clip_file = tmp_path / "clip.avi"
    clip_file.write_bytes(moving_shapes(seed=11))
    url = f"http://127.0.0.1:{server.metrics.port}/metrics"
    before = await scrape(url)

    target = f"127.0.0.1:{server.port}"
    answer = await run_cli(
        target,
        "generate",
        "What happens?",
        "--video",
        str(clip_file),
        "--frames",
        "4",
        "--max-tokens",
        "4",
    )
    assert answer.strip()
    after = await scrape(url)
    assert (
        after.value("mmgate_media_video_decodes_total")
        - before.value("mmgate_media_video_decodes_total")
        == 1
    )
    assert (
        after.value("mmgate_media_video_frames_total")
        - before.value("mmgate_media_video_frames_total")
        == 4
    )
    assert promtool_problems(after.text) == ""
    table = await run_cli(target, "stats")
    assert "clips decoded (frames)" in table
