"""`mmgate serve` with edges, as a deployment runs it: a core that dies leaves no edge behind
(an edge left holding the port would take callers' connections that nobody can answer); a
SIGTERM drains the streams in flight through the edges, then stops them."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import grpc
import psutil
import pytest
from grpc_health.v1.health_pb2 import HealthCheckRequest, HealthCheckResponse

from services.client import MmgateClient, build_request
from tests.support import RunningServer, start_server


async def answered(target: str) -> int:
    async with MmgateClient(target, timeout=30, retries=False) as client:
        return (await client.complete("hello", max_tokens=3)).final.usage.completion_tokens


async def refused(target: str) -> grpc.StatusCode:
    async with MmgateClient(target, timeout=5, retries=False) as client:
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await client.complete("hello", max_tokens=3)
    return failed.value.code()


def test_a_core_that_dies_takes_its_edges_with_it(tmp_path: Path, tiny_model: str) -> None:
    server = start_server(tmp_path, tiny_model, MMGATE_ENGINE__SYNTHETIC="{}", MMGATE_EDGES="2")
    core = psutil.Process(server.process.pid)
    edges = [p for p in core.children() if "services.api.relay.edge" in " ".join(p.cmdline())]
    try:
        assert len(edges) == 2
        assert asyncio.run(answered(server.target)) == 3  # through an edge, to the core
        core.kill()  # no drain, no SIGTERM to the edges: what an OOM kill is
        server.process.wait(timeout=30)
        _, alive = psutil.wait_procs(edges, timeout=20)
        assert alive == []
        assert asyncio.run(refused(server.target)) == grpc.StatusCode.UNAVAILABLE
    finally:
        for edge in edges:
            if edge.is_running():
                edge.kill()
        if server.process.poll() is None:
            server.process.kill()


async def drained_through_an_edge(server: RunningServer, tokens: int) -> list[int]:
    """A stream in flight through an edge when the core gets SIGTERM: the health the edges pass
    on, then a new call refused, then the stream's tokens. Returns the health statuses seen."""
    async with MmgateClient(server.target, timeout=60, retries=False) as client:
        request = build_request("Drain me", max_tokens=tokens, ignore_eos=True, temperature=0.0)
        stream = aiter(client.generate(request))
        events = [await anext(stream)]  # in flight
        watch = aiter(client.health_stub.Watch(HealthCheckRequest(service=""), timeout=30))
        statuses = [(await anext(watch)).status]
        server.process.send_signal(signal.SIGTERM)
        while statuses[-1] != HealthCheckResponse.NOT_SERVING:
            statuses.append((await anext(watch)).status)
        with pytest.raises(grpc.aio.AioRpcError) as late:
            await client.complete("Too late", max_tokens=1)
        assert late.value.code() == grpc.StatusCode.UNAVAILABLE
        assert server.process.poll() is None  # refused by a core still draining
        events += [event async for event in stream]
    assert events[-1].final.usage.completion_tokens == tokens
    return statuses


def test_sigterm_drains_the_streams_in_flight_through_the_edges_then_stops_them(
    tmp_path: Path, tiny_model: str
) -> None:
    # a step of 20 ms: the 150-token stream lasts 3 s, well past the moment of the SIGTERM
    server = start_server(
        tmp_path, tiny_model, MMGATE_ENGINE__SYNTHETIC='{"step_seconds": 0.02}', MMGATE_EDGES="2"
    )
    core = psutil.Process(server.process.pid)
    edges = [p for p in core.children() if "services.api.relay.edge" in " ".join(p.cmdline())]
    try:
        statuses = asyncio.run(drained_through_an_edge(server, 150))
        assert statuses[0] == HealthCheckResponse.SERVING
        assert server.process.wait(timeout=30) == 0, server.log()
        _, alive = psutil.wait_procs(edges, timeout=10)
        assert alive == []
        assert "Traceback" not in server.log(400)
    finally:
        for process in [*edges, core]:
            if process.is_running():
                process.kill()
