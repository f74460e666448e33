"""Health follows the cache actor and the engine, as a client watching it sees (in process, on
the tiny model): alive but not ready while the engine starts, SERVING once it is up; the actor
gone, neither ready nor alive."""

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest_asyncio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.api.health import LIVENESS, READINESS
from services.api.server import INFERENCE, MmgateServer
from services.config import Settings

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@pytest_asyncio.fixture
async def server(tiny_model: str) -> AsyncIterator[MmgateServer]:
    settings = Settings(
        port=0,
        engine={"model": tiny_model, "max_model_len": 256, "kv_cache_memory_bytes": 64 << 20},
        metrics={"enabled": False},
    )
    running = MmgateServer(settings)
    try:
        yield running
    finally:
        await running.stop(grace=0)


async def next_status(stream: grpc.aio.UnaryStreamCall, wanted: int) -> int:
    """The first status the Watch stream sends that is ``wanted`` (it sends every change)."""
    async for update in stream:
        if update.status == wanted:
            return int(update.status)
    raise AssertionError("the health stream ended")


async def test_readiness_needs_the_engine_and_liveness_the_actor(server: MmgateServer) -> None:
    starting = asyncio.ensure_future(server.start())  # the port opens first, then the engine
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{server.port}")
    health = health_pb2_grpc.HealthStub(channel)
    try:
        # the engine takes seconds to start; the port answers at once
        readiness = health.Watch(
            health_pb2.HealthCheckRequest(service=READINESS), timeout=60, wait_for_ready=True
        )
        first = await anext(aiter(readiness))
        assert first.status == NOT_SERVING
        alive = await health.Check(health_pb2.HealthCheckRequest(service=LIVENESS))
        assert alive.status == SERVING
        assert await next_status(readiness, SERVING) == SERVING  # the engine is up
        readiness.cancel()
        await starting

        for service in ("", INFERENCE, READINESS, LIVENESS):
            response = await health.Check(health_pb2.HealthCheckRequest(service=service))
            assert response.status == SERVING

        liveness = health.Watch(health_pb2.HealthCheckRequest(service=LIVENESS), timeout=30)
        readiness = health.Watch(health_pb2.HealthCheckRequest(service=READINESS), timeout=30)
        assert await next_status(liveness, SERVING) == SERVING
        assert await next_status(readiness, SERVING) == SERVING
        await server.cache.aclose()  # the actor is gone: the monitor notices within a second
        assert await next_status(liveness, NOT_SERVING) == NOT_SERVING
        assert await next_status(readiness, NOT_SERVING) == NOT_SERVING
        liveness.cancel()
        readiness.cancel()
    finally:
        await channel.close()
        if not starting.done():  # a failure above: the fixture's stop() does the rest
            starting.cancel()
            await asyncio.gather(starting, return_exceptions=True)
