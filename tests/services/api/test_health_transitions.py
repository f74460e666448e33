"""A server's life in process, on the tiny model, with one engine start: health follows the
cache actor and the engine as a client watching it sees (alive but not ready while the engine
starts, SERVING once it is up; the actor gone, neither ready nor alive), and closing the engine
stops mmgate's use of it before the engine itself stops.

The tests run in this order on one server: the first watches it start, the second closes it.
"""

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
import pytest_asyncio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.api.health import LIVENESS, READINESS
from services.api.server import INFERENCE, MmgateServer
from services.config import Settings
from services.types import EngineRequest, Sampling

pytestmark = pytest.mark.asyncio(loop_scope="module")

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@pytest_asyncio.fixture(scope="module", loop_scope="module")
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


async def test_the_output_handler_stops_before_the_engine_core(
    server: MmgateServer, caplog: pytest.LogCaptureFixture
) -> None:
    """vLLM's shutdown stops its core first and its output handler after, so a handler still
    waiting for output met a dead core and logged EngineDeadError's traceback: mmgate stops
    the handler first."""
    if not server.engine.ready:  # run on its own: the server has not started yet
        await server.start()
    worker = server.engine
    request = EngineRequest(
        request_id="mmgate-close-test",
        prompt_token_ids=(1, 2, 3),
        sampling=Sampling(max_tokens=2, temperature=0.0),
    )
    deltas = [delta async for delta in worker.generate(request)]
    assert deltas[-1].finish_reason == "length"

    engine: Any = worker._engine
    handler = engine.output_handler
    assert handler is not None
    assert not handler.done()  # waiting for the engine's next output
    core = engine.engine_core
    handler_done_at_core_shutdown: list[bool] = []
    shut_down = core.shutdown

    def shutdown(*args: Any, **kwargs: Any) -> None:
        handler_done_at_core_shutdown.append(handler.done())
        shut_down(*args, **kwargs)

    core.shutdown = shutdown
    caplog.set_level(logging.ERROR, logger="vllm")
    await worker.close()
    assert handler_done_at_core_shutdown == [True]
    assert not [r for r in caplog.records if "output_handler failed" in r.getMessage()]
