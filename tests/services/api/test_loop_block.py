"""A blocked event loop, in process on the tiny model: the heartbeat thread notices while the loop
is still stuck (the log names the function it is stuck in, /metrics says so from its own thread),
health reads NOT_SERVING the moment the loop moves, and SERVING again once it has kept moving.
The detection time is measured and printed (docs/service.md quotes it)."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import urllib.request
from collections.abc import AsyncIterator

import grpc
import pytest
import pytest_asyncio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.api.health import READINESS
from services.api.server import MmgateServer
from services.config import Settings
from tests.support import eventually

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
BLOCK_SECONDS = 0.5
RECOVER_SECONDS = 1.0
BLOCKED_FOR = 2.5  # what the test blocks the loop for


@pytest_asyncio.fixture
async def server(tiny_model: str) -> AsyncIterator[MmgateServer]:
    settings = Settings(
        port=0,
        engine={"model": tiny_model, "max_model_len": 256, "kv_cache_memory_bytes": 64 << 20},
        metrics={"port": 0},
        health={
            "interval_seconds": 0.2,
            "loop_block_seconds": BLOCK_SECONDS,
            "loop_recover_seconds": RECOVER_SECONDS,
        },
    )
    running = MmgateServer(settings)
    try:
        await running.start()
        yield running
    finally:
        await running.stop(grace=0)


def blocked_gauge(url: str) -> float | None:
    with urllib.request.urlopen(url, timeout=10) as response:
        for line in response.read().decode().splitlines():
            if line.startswith("mmgate_event_loop_blocked "):
                return float(line.split()[1])
    return None


def a_handler_that_blocks_the_loop(seconds: float) -> None:
    time.sleep(seconds)  # what a CPU-bound call on the loop does to every other request


async def test_a_blocked_loop_is_seen_from_a_thread(
    server: MmgateServer, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"http://127.0.0.1:{server.metrics.port}/metrics"
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{server.port}")
    health = health_pb2_grpc.HealthStub(channel)
    readiness = health_pb2.HealthCheckRequest(service=READINESS)
    try:
        assert (await health.Check(readiness, timeout=10)).status == SERVING
        assert await asyncio.to_thread(blocked_gauge, url) == 0

        seen: dict[str, float] = {}
        blocking = threading.Event()

        def scrape_while_blocked() -> None:
            blocking.wait(timeout=30)
            while "gauge" not in seen and time.monotonic() - seen["start"] < BLOCKED_FOR:
                if blocked_gauge(url) == 1:
                    seen["gauge"] = time.monotonic() - seen["start"]

        scraper = threading.Thread(target=scrape_while_blocked)
        scraper.start()
        caplog.set_level(logging.WARNING, logger="mmgate.heartbeat")
        seen["start"] = time.monotonic()
        blocking.set()
        a_handler_that_blocks_the_loop(BLOCKED_FOR)  # on the loop: nothing else runs here
        await asyncio.to_thread(scraper.join, 10)

        # the thread saw it while the loop was stuck
        assert "gauge" in seen, "/metrics never said the loop was blocked"
        assert seen["gauge"] < BLOCKED_FOR
        warnings = [
            r.getMessage() for r in caplog.records if "event loop blocked" in r.getMessage()
        ]
        assert len(warnings) == 1
        assert "a_handler_that_blocks_the_loop" in warnings[0]  # the stack it is stuck in
        assert "time.sleep(seconds)" in warnings[0]

        # the first answer once it moves: not ready; then ready again once it keeps moving
        assert (await health.Check(readiness, timeout=10)).status == NOT_SERVING

        async def ready() -> bool:
            answer: health_pb2.HealthCheckResponse = await health.Check(readiness, timeout=10)
            return bool(answer.status == SERVING)

        recovered = await eventually(ready, timeout=30)
        assert recovered >= RECOVER_SECONDS * 0.5
        assert await asyncio.to_thread(blocked_gauge, url) == 0
        assert server.monitor.heartbeat.blocks == 1
        print(
            f"\nloop blocked -> seen from a thread (/metrics) {seen['gauge']:.2f} s "
            f"(loop_block_seconds {BLOCK_SECONDS}); moved -> SERVING {recovered:.2f} s "
            f"(loop_recover_seconds {RECOVER_SECONDS})"
        )
    finally:
        await channel.close()
