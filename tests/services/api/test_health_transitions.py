"""A server's life as a client watching its health sees it, on the session's in-process server
(tests/services/in_process.py): alive but not ready while the engine starts, SERVING once it is
up; the actor dead with on_failure "fail", neither ready nor alive; and closing the engine stops
mmgate's use of it before the engine itself stops. The two that end the server run last
(``ends_server``).
"""

import logging
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.api.grpc_server import INFERENCE
from services.api.health import CACHE_ACTOR, LIVENESS, READINESS
from services.types import EngineRequest, Sampling

from ..in_process import InProcess, vllm_worker

pytestmark = pytest.mark.asyncio(loop_scope="session")

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


async def next_status(stream: grpc.aio.UnaryStreamCall, wanted: int) -> int:
    """The first status the Watch stream sends that is ``wanted`` (it sends every change)."""
    async for update in stream:
        if update.status == wanted:
            return int(update.status)
    raise AssertionError("the health stream ended")


async def health_of(health: health_pb2_grpc.HealthStub, service: str) -> int:
    response = await health.Check(health_pb2.HealthCheckRequest(service=service))
    return int(response.status)


async def test_readiness_waits_for_the_engine_and_liveness_does_not(
    llava_in_process: InProcess,
) -> None:
    # watched from the moment the port opened: the engine takes seconds more to start
    startup = llava_in_process.startup
    assert startup.readiness[0] == NOT_SERVING
    assert startup.readiness[-1] == SERVING
    assert startup.liveness == SERVING
    server = llava_in_process.server
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", INFERENCE, READINESS, LIVENESS, CACHE_ACTOR):
            response = await health.Check(health_pb2.HealthCheckRequest(service=service))
            assert response.status == SERVING, service


@pytest.mark.ends_server
async def test_with_on_failure_fail_a_dead_actor_leaves_it_neither_ready_nor_alive(
    llava_in_process: InProcess,
) -> None:
    """MMGATE_CACHE__ON_FAILURE=fail, the behaviour before degraded mode: no replacement."""
    server = llava_in_process.server
    server.cache.on_failure = "fail"
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        health = health_pb2_grpc.HealthStub(channel)
        liveness = health.Watch(health_pb2.HealthCheckRequest(service=LIVENESS), timeout=30)
        readiness = health.Watch(health_pb2.HealthCheckRequest(service=READINESS), timeout=30)
        assert await next_status(liveness, SERVING) == SERVING
        assert await next_status(readiness, SERVING) == SERVING
        dead = server.cache.actor
        dead.inject_fault("crash")  # the actor is gone: the monitor notices within a second
        assert await next_status(liveness, NOT_SERVING) == NOT_SERVING
        assert await next_status(readiness, NOT_SERVING) == NOT_SERVING
        assert server.cache.actor is dead
        assert await health_of(health, CACHE_ACTOR) == NOT_SERVING
        liveness.cancel()
        readiness.cancel()


@pytest.mark.ends_server
async def test_the_output_handler_stops_before_the_engine_core(
    llava_in_process: InProcess, caplog: pytest.LogCaptureFixture
) -> None:
    """vLLM's shutdown stops its core first and its output handler after, so a handler still
    waiting for output met a dead core and logged EngineDeadError's traceback: mmgate stops
    the handler first."""
    worker = vllm_worker(llava_in_process.server)
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
