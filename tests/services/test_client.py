"""``SyncClient`` over real servers: every call of ``MmgateClient``, blocking, and the resend of an
image's bytes when the server no longer holds it (also for ``MmgateClient``'s stream).

The text model is the session's ``server``; the vision calls need a LLaVA, served here by a child
process on the tiny random one (built by its CLI, so this module imports nothing of the server).
A client interceptor records what the client put on the wire: an image goes by ``digest`` or as
``data``.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2

from services.client import MmgateClient, SyncClient, build_request, digest_of
from services.client.requests import affinity_of
from services.proto.mmgate.v1 import inference_pb2 as pb
from services.wire import AFFINITY_HEADER
from tests.support import RunningServer

from .imagegen import png

ROOT = Path(__file__).resolve().parents[2]
LONG: dict[str, Any] = {"max_tokens": 900, "ignore_eos": True, "temperature": 0.0}


def sync_client(server: RunningServer, **options: Any) -> SyncClient:
    return SyncClient(server.target, timeout=60.0, **options)


def prompt_key(final: pb.GenerateFinal) -> str:
    [lookup] = [entry for entry in final.cache.lookups if entry.stage == "prompt"]
    return lookup.key


# --- every call, on the text model ---------------------------------------------------------


def test_complete_and_stream_text_give_the_same_answer(server: RunningServer) -> None:
    with sync_client(server) as client:
        before = client.stats().engine.requests
        streamed = "".join(client.stream_text("Hi", max_tokens=6, temperature=0.0))
        completed = client.complete("Hi", max_tokens=6, temperature=0.0, timeout=30.0)
        assert streamed == completed.text
        assert completed.final.usage.completion_tokens > 0
        stats = client.stats()
        assert stats.engine.requests > before
        assert stats.model


def test_samples_logprobs_and_token_ids_through_the_sync_client(server: RunningServer) -> None:
    request = build_request(token_ids=[5, 6, 7], n=2, logprobs=1, prompt_logprobs=0)
    assert request.WhichOneof("input") == "token_ids"
    assert list(request.token_ids.ids) == [5, 6, 7]
    assert (request.sampling.n, request.sampling.logprobs, request.sampling.prompt_logprobs) == (
        2,
        1,
        0,
    )
    with sync_client(server) as client:
        answer = client.complete(
            token_ids=[5, 6, 7], n=2, temperature=0.9, logprobs=1, max_tokens=3, ignore_eos=True
        )
    assert [choice.index for choice in answer.choices] == [0, 1]
    assert all(len(c.logprobs) == len(c.token_ids) == 3 for c in answer.choices)
    assert answer.final.usage.prompt_tokens == 3


def test_generate_streams_deltas_then_one_final(server: RunningServer) -> None:
    request = build_request("Count", max_tokens=5, temperature=0.0, ignore_eos=True)
    with sync_client(server) as client:
        events = list(client.generate(request))
        answer = client.complete_request(request)
    *deltas, last = events
    assert [e.WhichOneof("event") for e in deltas] == ["delta"] * len(deltas)
    assert last.HasField("final")
    assert last.final.usage.completion_tokens == 5
    assert "".join(e.delta.text for e in deltas) == answer.text


def test_closing_generate_early_cancels_the_call(server: RunningServer) -> None:
    request = build_request("Long story", **LONG)
    with sync_client(server) as client:

        def settled() -> Any:
            client.complete("tick", max_tokens=1)  # the engine has stepped since
            return client.stats().engine

        # as in test_cancel: on a loaded machine the engine may finish all 900 tokens before
        # the first one is sent; try again until the cancellation lands mid-generation
        for _ in range(5):
            before = settled()
            stream = client.generate(request)
            assert next(stream).HasField("delta")
            stream.close()
            after = settled()
            assert after.running == 0
            if after.aborted == before.aborted + 1:
                return
            assert after.requests == before.requests + 2  # the long request (whole), the tick
    raise AssertionError("the engine finished 900 tokens before each of 5 cancellations")


def test_every_call_has_a_deadline(server: RunningServer) -> None:
    with SyncClient(server.target, timeout=0.05) as hurried:
        with pytest.raises(grpc.RpcError) as caught:
            hurried.complete("Long story", **LONG)
        assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    with sync_client(server) as client:
        with pytest.raises(grpc.RpcError) as caught:
            list(client.generate(build_request("Long story", **LONG), timeout=0.05))
        assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED


def test_the_tenant_goes_with_each_call(server: RunningServer) -> None:
    with sync_client(server, tenant="team-sync") as mine, sync_client(server) as other:
        key = prompt_key(mine.complete("A tenant's own prompt", max_tokens=2).final)
        assert mine.inspect(key).state == "stored"
        assert other.inspect(key).state == "absent"
        assert not other.invalidate(key)
        assert mine.invalidate(key)
    with sync_client(server, tenant="bad tenant!") as bad:
        with pytest.raises(grpc.RpcError) as caught:
            bad.complete("x", max_tokens=1)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        with pytest.raises(grpc.RpcError) as caught:
            list(bad.generate(build_request("x", max_tokens=1)))
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_inspect_and_invalidate_a_cache_key(server: RunningServer) -> None:
    with sync_client(server) as client:
        key = prompt_key(client.complete("Forget me, synchronously", max_tokens=2).final)
        seen = client.inspect(key)
        assert (seen.key, seen.state) == (key, "stored")
        assert client.invalidate(key)
        assert client.inspect(key).state == "absent"
        assert not client.invalidate(key)


def test_health(server: RunningServer) -> None:
    with sync_client(server) as client:
        assert client.health() == health_pb2.HealthCheckResponse.SERVING
        assert client.health("mmgate.v1.Inference") == health_pb2.HealthCheckResponse.SERVING
        checked = client.health_stub.Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert checked.status == health_pb2.HealthCheckResponse.SERVING


def test_a_text_model_refuses_prefetch(server: RunningServer) -> None:
    with sync_client(server) as client:
        with pytest.raises(grpc.RpcError) as caught:
            client.prefetch(png(1))
        assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert digest_of(png(1)) not in client.held


# --- images, on a vision model -------------------------------------------------------------


def test_the_cli_builds_the_tiny_llava(tmp_path: Path) -> None:
    """The model the image tests use, built as a user would: the CLI's current name, else its
    next one."""
    path = tmp_path / "tiny-llava"
    mmgate = Path(sys.executable).with_name("mmgate")
    commands = [[sys.executable, "-m", "services.models", "tiny-llava", str(path)]]
    if mmgate.exists():
        commands.append([str(mmgate), "models", "tiny-llava", str(path)])
    failures = []
    for command in commands:
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=240)
        if done.returncode == 0:
            assert (path / "config.json").exists()
            return
        failures.append(f"{' '.join(command[1:])}: exit {done.returncode}\n{done.stderr[-2000:]}")
    raise AssertionError("could not build the tiny LLaVA:\n" + "\n".join(failures))


def sources(request: pb.GenerateRequest) -> list[str]:
    """How each image went: "digest" or "data"."""
    return [image.WhichOneof("source") or "" for image in request.images]


class Recorder(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
    """The image sources of each Generate and Complete call a SyncClient sent."""

    def __init__(self) -> None:
        self.sent: list[list[str]] = []
        self.affinity: list[str | None] = []  # the x-mmgate-affinity header of each call

    def _record(self, details: Any, request: Any) -> None:
        if details.method.endswith(("/Generate", "/Complete")):
            self.sent.append(sources(request))
        if details.method.endswith(("/Generate", "/Complete", "/Prefetch")):
            self.affinity.append(dict(details.metadata or ()).get(AFFINITY_HEADER))

    def intercept_unary_unary(
        self, continuation: Callable[[Any, Any], Any], details: Any, request: Any
    ) -> Any:
        self._record(details, request)
        return continuation(details, request)

    def intercept_unary_stream(
        self, continuation: Callable[[Any, Any], Any], details: Any, request: Any
    ) -> Any:
        self._record(details, request)
        return continuation(details, request)


class AioRecorder(grpc.aio.UnaryStreamClientInterceptor):
    """The image sources of each Generate stream a MmgateClient sent."""

    def __init__(self) -> None:
        self.sent: list[list[str]] = []

    async def intercept_unary_stream(
        self, continuation: Callable[[Any, Any], Awaitable[Any]], details: Any, request: Any
    ) -> Any:
        self.sent.append(sources(request))
        return await continuation(details, request)


@pytest.fixture
def recorded(llava_server: RunningServer) -> Iterator[tuple[SyncClient, Recorder]]:
    recorder = Recorder()
    channel = grpc.intercept_channel(grpc.insecure_channel(llava_server.target), recorder)
    with SyncClient(timeout=60.0, channel=channel) as client:
        yield client, recorder


def ask(*images: bytes) -> pb.GenerateRequest:
    return build_request(
        "What is in the picture?", images=list(images), max_tokens=4, temperature=0.0
    )


def test_a_held_image_goes_by_digest_and_its_bytes_again_once_the_server_lost_it(
    recorded: tuple[SyncClient, Recorder],
) -> None:
    client, recorder = recorded
    data = png(501)
    first = client.complete_request(ask(data))
    [report] = first.final.cache.images
    assert (report.digest, report.outcome) == (digest_of(data), "miss")
    assert report.digest in client.held

    second = client.complete_request(ask(data))
    held = second.final.cache.images[0]
    assert (held.outcome, held.tier) == ("hit", "memory")
    assert second.token_ids == first.token_ids

    assert client.invalidate(digest=report.digest)
    before = client.stats().media
    third = client.complete_request(ask(data))
    after = client.stats().media
    assert third.final.cache.images[0].outcome == "miss"  # decoded again, from the resent bytes
    assert third.token_ids == first.token_ids
    assert (after.not_held, after.decodes) == (before.not_held + 1, before.decodes + 1)
    assert recorder.sent == [["data"], ["digest"], ["digest"], ["data"]]
    assert report.digest in client.held  # learnt again from the third answer


def test_the_stream_resends_the_bytes_too(recorded: tuple[SyncClient, Recorder]) -> None:
    client, recorder = recorded
    data = png(502)
    first = client.complete_request(ask(data))
    assert client.invalidate(digest=first.final.cache.images[0].digest)
    *deltas, last = client.generate(ask(data))
    assert deltas
    assert all(e.HasField("delta") for e in deltas)
    assert last.final.cache.images[0].outcome == "miss"
    assert recorder.sent == [["data"], ["digest"], ["data"]]


def test_prefetch_then_by_digest_only(recorded: tuple[SyncClient, Recorder]) -> None:
    client, recorder = recorded
    data = png(503)
    warmed = client.prefetch(data)
    # the session's tiny LLaVA runs in pixels mode: the decoded image is what mmgate holds
    assert (warmed.digest, warmed.outcome, warmed.form) == (digest_of(data), "miss", "pixels")
    seen = client.inspect(digest=warmed.digest)
    assert {s.stage: s.state for s in seen.stages} == {"image": "stored"}
    answer = client.complete("<image> What is this?", images=[data], max_tokens=4)
    assert answer.final.cache.images[0].outcome == "hit"
    assert recorder.sent == [["digest"]]


async def test_the_async_stream_resends_the_bytes(llava_server: RunningServer) -> None:
    # test_images covers MmgateClient.complete_request's resend; this is its Generate stream
    recorder = AioRecorder()
    channel = grpc.aio.insecure_channel(llava_server.target, interceptors=[recorder])
    async with MmgateClient(timeout=60.0, channel=channel) as client:
        data = png(504)
        first = await client.complete_request(ask(data))
        assert await client.invalidate(digest=first.final.cache.images[0].digest)
        events = [event async for event in client.generate(ask(data))]
    assert events[-1].final.cache.images[0].outcome == "miss"
    assert recorder.sent == [["digest"], ["data"]]  # the Generate calls (Complete not recorded)


def test_each_call_names_its_affinity_for_the_mesh(recorded: tuple[SyncClient, Recorder]) -> None:
    client, recorder = recorded
    picture, other = png(11), png(12)
    system = "You describe pictures in one word."
    chat = build_request(
        messages=[("system", system), ("user", "<image> and <image>: what are they?")],
        images=[picture, other],
        max_tokens=2,
    )
    client.complete_request(chat)
    client.complete_request(chat)  # the image now goes by digest: the same key
    client.complete_request(
        build_request(messages=[("system", system), ("user", "Hi")], max_tokens=2)
    )
    client.complete_request(build_request("Hi", max_tokens=2))
    client.prefetch(other)
    assert recorder.affinity == [
        digest_of(picture),  # the first image's digest
        digest_of(picture),
        digest_of(system.encode()),  # no image: the shared system prompt's
        None,  # neither: no header, any replica will do
        digest_of(other),
    ]


def test_a_malformed_digest_sends_no_affinity() -> None:
    # the server refuses the digest (INVALID_ARGUMENT); the client must not fail on the header
    request = build_request("<image> What is it?", max_tokens=2)
    request.images.add(digest="sha256:not\nhex\u00e9")
    assert affinity_of(request) is None
    request.images[0].digest = digest_of(b"x")
    assert affinity_of(request) == digest_of(b"x")


def test_the_bundled_clients_take_answers_as_large_as_the_server_sends() -> None:
    from services.client.credentials import channel_options
    from services.config import Settings

    for retries in (True, False):
        taken = dict(channel_options(retries=retries))["grpc.max_receive_message_length"]
        assert isinstance(taken, int)
        assert taken >= Settings().max_send_bytes


def test_the_router_and_token_calls_through_the_sync_client(server: RunningServer) -> None:
    with sync_client(server) as client:
        info = client.server_info()
        assert info.model == client.model_info().model
        assert info.replica
        assert client.load().ready
        ids = client.tokenize("Hello there", raw=True)
        assert client.detokenize(ids) == "Hello there"
        with pytest.raises(grpc.RpcError) as unknown:
            client.abort("no-such-request")
        assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
