"""`mmgate serve` with edges, as a deployment runs it: a core that dies leaves no edge behind
(an edge left holding the port would take callers' connections that nobody can answer)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import psutil
import pytest

from services.client import MmgateClient
from tests.support import start_server


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
