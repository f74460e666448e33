"""A replica's front end on several processes: edges in front of the core, real gRPC all the way
(the callers' connections, the Unix sockets between the processes), over the synthetic engine."""

from __future__ import annotations

import asyncio
import os
import signal
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc
import pytest
import pytest_asyncio
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from services.api.server import MmgateServer
from services.client import build_request
from services.engine.synthetic_engine import SyntheticEngine
from tests.services.api.synthetic_server import client_of, synthetic_server
from tests.services.auth.support import TOKENS
from tests.support import eventually

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def edged(
    tiny_model: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[tuple[MmgateServer, InMemorySpanExporter]]:
    async with synthetic_server(
        tiny_model, tmp_path_factory.mktemp("edged"), step_seconds=0.005, edges=2
    ) as started:
        yield started


def engine_of(server: MmgateServer) -> SyntheticEngine:
    assert isinstance(server.engine, SyntheticEngine)
    return server.engine


async def test_streams_are_relayed_through_the_edges_and_every_other_call_passes(
    edged: tuple[MmgateServer, InMemorySpanExporter],
) -> None:
    server, exporter = edged
    assert server.edges is not None
    assert len(server.edges.pids()) == 2
    assert server.relay is not None
    assert server.relay.edges == 2
    asked = engine_of(server).stats().requests
    async with client_of(server) as client:
        messages = [m async for m in client.generate(build_request("hello there", max_tokens=12))]
        whole = await client.complete("hello there", max_tokens=12)  # passed through
        info = await client.model_info()
        health = await client.health()
    deltas = [m for m in messages if m.HasField("delta")]
    # every token relayed, a message an engine step: a synthetic clock that ran late on a loaded
    # host makes two tokens in one step (CI once saw 11 messages for 12 tokens)
    assert sum(len(d.delta.token_ids) for d in deltas) == 12
    assert len(deltas) >= 6
    assert messages[-1].HasField("final")
    assert messages[-1].final.usage.completion_tokens == 12
    assert "".join(d.delta.text for d in deltas) == whole.text
    assert [(r.stage, r.outcome) for r in messages[-1].final.cache.lookups] == [("prompt", "miss")]
    assert [(r.stage, r.outcome) for r in whole.final.cache.lookups] == [("prompt", "hit")]
    assert info.model
    assert health == 1
    assert engine_of(server).stats().requests == asked + 2
    # the relayed call met the core's tracing: its server span and its lookup's
    names = {span.name for span in exporter.get_finished_spans()}
    assert {"/mmgate.v1.Inference/Generate", "cache.lookup"} <= names


async def test_a_relayed_call_meets_the_auth_gate_and_the_parser(
    edged: tuple[MmgateServer, InMemorySpanExporter],
) -> None:
    server, _ = edged
    asked = engine_of(server).stats().requests
    async with client_of(server, "not-a-token") as client:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            async for _ in client.generate(build_request("hello", max_tokens=2)):
                pass
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    # bytes that are no GenerateRequest: mmgate's words, through the edge
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        garbage = channel.unary_stream("/mmgate.v1.Inference/Generate")
        metadata = (("authorization", f"Bearer {TOKENS['alpha']}"),)
        with pytest.raises(grpc.aio.AioRpcError) as unparsed:
            async for _ in garbage(b"\xff\xff\xff", metadata=metadata, timeout=10):
                pass
    assert unparsed.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "protobuf" in (unparsed.value.details() or "")
    assert engine_of(server).stats().requests == asked


def aborted_and_idle(engine: SyntheticEngine, aborted: int) -> Callable[[], Awaitable[bool]]:
    """Whether the engine has aborted ``aborted`` requests in all and runs none."""

    async def holds() -> bool:
        stats = engine.stats()
        return stats.aborted == aborted and stats.running == 0

    return holds


async def test_a_caller_that_leaves_or_runs_out_of_time_stops_the_engine_request(
    edged: tuple[MmgateServer, InMemorySpanExporter],
) -> None:
    server, _ = edged
    engine = engine_of(server)
    aborted = engine.stats().aborted
    async with client_of(server) as client:
        stream = client.generate(build_request("a long answer", max_tokens=1000, ignore_eos=True))
        async for message in stream:
            if message.HasField("delta"):
                break
        await stream.aclose()  # cancels the call at the edge
        await eventually(aborted_and_idle(engine, aborted + 1), timeout=10)
        with pytest.raises(grpc.aio.AioRpcError) as late:
            async for _ in client.generate(
                build_request("a long answer", max_tokens=1000, ignore_eos=True), timeout=0.5
            ):
                pass
    assert late.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    await eventually(aborted_and_idle(engine, aborted + 2), timeout=10)


async def test_abort_through_the_edges_ends_a_relayed_stream_and_its_engine_run(
    edged: tuple[MmgateServer, InMemorySpanExporter],
) -> None:
    server, _ = edged
    engine = engine_of(server)
    aborted = engine.stats().aborted
    async with client_of(server) as client:
        stream = client.generate(
            build_request("a long answer", max_tokens=1000, ignore_eos=True, request_id="edge-1")
        )
        assert (await anext(stream)).HasField("delta")
        assert await client.abort("edge-1") == ["edge-1"]
        with pytest.raises(grpc.aio.AioRpcError) as ended:
            async for _ in stream:
                pass
        load = await client.load()  # a router's poll passes through too
    assert ended.value.code() == grpc.StatusCode.CANCELLED
    assert ended.value.details() == "the request was aborted (Inference.Abort)"
    assert load.ready
    await eventually(aborted_and_idle(engine, aborted + 1), timeout=10)


async def test_many_streams_at_once_each_get_their_own_tokens(
    edged: tuple[MmgateServer, InMemorySpanExporter],
) -> None:
    server, _ = edged

    async def one(index: int) -> tuple[int, int]:
        async with client_of(server) as client:  # a connection each: both edges take some
            count = 0
            async for message in client.generate(
                build_request(f"stream {index}", max_tokens=20, ignore_eos=True)
            ):
                count += len(message.delta.token_ids)  # merged where the reader fell behind
                if message.HasField("final"):
                    return count, message.final.usage.completion_tokens
        raise AssertionError("no final message")

    results = await asyncio.gather(*(one(i) for i in range(24)))
    assert results == [(20, 20)] * 24


async def test_a_killed_edge_is_started_again_and_the_port_keeps_serving(
    edged: tuple[MmgateServer, InMemorySpanExporter],
) -> None:
    server, _ = edged
    assert server.edges is not None
    assert server.relay is not None
    victim = server.edges.pids()[0]
    os.kill(victim, signal.SIGKILL)

    async def replaced() -> bool:
        pids = server.edges.pids() if server.edges is not None else []
        return victim not in pids and len(pids) == 2 and server.relay.edges == 2  # type: ignore[union-attr]

    await eventually(replaced, timeout=30)
    for _ in range(6):  # new connections, whichever edge takes them
        async with client_of(server) as client:
            answer = await client.complete("still there?", max_tokens=3)
        assert answer.final.usage.completion_tokens == 3


async def test_an_edge_answers_unknown_methods_as_the_core_does(
    edged: tuple[MmgateServer, InMemorySpanExporter],
) -> None:
    """UNIMPLEMENTED every time: passed through as a stream, a call the core ended before
    reading its request once reached the caller as INTERNAL (4% of calls)."""
    server, _ = edged
    codes: Counter[str] = Counter()
    for _ in range(100):  # a connection each: both edges take some
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            unknown = channel.unary_unary("/mmgate.v1.Inference/NoSuchMethod")
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await unknown(b"", timeout=10)
        codes[refused.value.code().name] += 1
    assert codes == {"UNIMPLEMENTED": 100}


async def test_streaming_methods_pass_through_in_their_own_shape(
    edged: tuple[MmgateServer, InMemorySpanExporter],
) -> None:
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    server, _ = edged
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        watch = health_pb2_grpc.HealthStub(channel).Watch(
            health_pb2.HealthCheckRequest(), timeout=10
        )
        first = await watch.read()
        watch.cancel()  # a server stream the caller leaves
        asked = reflection_pb2.ServerReflectionRequest(list_services="")
        reflected = reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(
            iter([asked, asked]), timeout=10
        )
        answers = [answer async for answer in reflected]  # requests and answers both streamed
    assert first.status == health_pb2.HealthCheckResponse.SERVING
    assert len(answers) == 2
    names = {s.name for s in answers[0].list_services_response.service}
    assert {"mmgate.v1.Inference", "mmgate.v1.Cache", "grpc.health.v1.Health"} <= names
    assert "mmgate.v1.Relay" not in names  # the core's edges' own service is nobody else's
