"""The engine watchdog on a real server and its real engine core process: stopped (SIGSTOP) while a
request runs, readiness turns NOT_SERVING, then liveness once it is hung, and both return when
the engine steps again (SIGCONT); killed, liveness fails, GetStats stops reporting the dead
engine's requests, and callers read mmgate's words. The detection times are measured and printed
(docs/service.md quotes them)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2

from services.client import MmgateClient, build_request
from tests.support import engine_core, eventually

from ..conftest import RunningServer, start_server
from ..prom import scrape

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
STALL_SECONDS = 1.0
HUNG_SECONDS = 6.0
INTERVAL_SECONDS = 0.2


@pytest.fixture(scope="module")
def watched(tiny_model: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    running = start_server(
        tmp_path_factory.mktemp("watchdog"),
        tiny_model,
        MMGATE_HEALTH__INTERVAL_SECONDS=str(INTERVAL_SECONDS),
        MMGATE_HEALTH__ENGINE_STALL_SECONDS=str(STALL_SECONDS),
        MMGATE_HEALTH__ENGINE_HUNG_SECONDS=str(HUNG_SECONDS),
    )
    yield running
    core = engine_core(running)
    if core is not None:  # never leave a stopped process behind
        os.kill(core.pid, signal.SIGCONT)
    running.stop()  # after the engine's death the exit code is not the point here


@pytest.fixture
async def client(watched: RunningServer) -> AsyncIterator[MmgateClient]:
    async with watched.client(timeout=60.0) as client:
        yield client


def status_is(client: MmgateClient, service: str, wanted: int) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return await client.health(service) == wanted

    return check


async def long_running(client: MmgateClient) -> grpc.aio.UnaryStreamCall:
    """A request in the middle of its run: the engine has work to do."""
    request = build_request("Tell a long story", max_tokens=900, temperature=0.0)
    request.sampling.ignore_eos = True
    request.request_id = "long-story"
    call = client.inference.Generate(request, timeout=120)
    await anext(aiter(call))
    return call


async def test_a_stopped_engine_turns_health_not_serving_and_back(
    watched: RunningServer, client: MmgateClient
) -> None:
    core = engine_core(watched)
    assert core is not None, watched.log()
    call = await long_running(client)
    stopped = time.monotonic()
    os.kill(core.pid, signal.SIGSTOP)
    try:
        await eventually(status_is(client, "readiness", NOT_SERVING), timeout=30)
        to_not_ready = time.monotonic() - stopped
        # stalled, not yet hung: the process is still worth keeping
        assert await client.health("liveness") == SERVING
        stats = await client.stats()
        assert stats.engine_health.state == "stalled"
        assert stats.engine_health.in_flight == 1
        assert stats.engine_health.seconds_since_step >= STALL_SECONDS

        await eventually(status_is(client, "liveness", NOT_SERVING), timeout=30)
        to_not_alive = time.monotonic() - stopped
        assert (await client.stats()).engine_health.state == "hung"
    finally:
        resumed = time.monotonic()
        os.kill(core.pid, signal.SIGCONT)
    await eventually(status_is(client, "readiness", SERVING), timeout=30)
    to_ready = time.monotonic() - resumed
    assert await client.health("liveness") == SERVING
    # the caller's stream was only delayed: it goes on to its end
    finals = [event async for event in call if event.HasField("final")]
    assert finals[0].final.usage.completion_tokens == 900

    health = (await client.stats()).engine_health
    assert (health.state, health.in_flight, health.stalls) == ("serving", 0, 1)
    assert (await scrape(watched.metrics_url)).value("mmgate_engine_stalls_total") == 1
    log = watched.log(400)
    assert "engine stalled: no engine step for" in log
    assert "('long-story')" in log  # the log names what is waiting, by the caller's label
    assert "engine stepping again" in log
    print(
        f"\nengine stopped -> readiness NOT_SERVING {to_not_ready:.2f} s (stall {STALL_SECONDS} s)"
        f"; -> liveness NOT_SERVING {to_not_alive:.2f} s (hung {HUNG_SECONDS} s)"
        f"; resumed -> SERVING {to_ready:.2f} s"
    )


async def test_a_killed_engine_fails_liveness(watched: RunningServer, client: MmgateClient) -> None:
    core = engine_core(watched)
    assert core is not None
    call = await long_running(client)
    killed = time.monotonic()
    os.kill(core.pid, signal.SIGKILL)
    await eventually(status_is(client, "liveness", NOT_SERVING), timeout=30)
    to_not_alive = time.monotonic() - killed
    assert await client.health("readiness") == NOT_SERVING

    # the request that was running ends with mmgate's words, as does a new one
    with pytest.raises(grpc.aio.AioRpcError) as running:
        async for _ in call:
            pass
    with pytest.raises(grpc.aio.AioRpcError) as new:
        await client.complete("Hi", max_tokens=2)
    for error in (running.value, new.value):
        assert error.code() == grpc.StatusCode.UNAVAILABLE, error
        details = error.details() or ""
        assert "engine" in details
        assert "stack trace" not in details.lower()
        assert "Error" not in details  # no class names

    stats = await client.stats()
    assert stats.engine_health.state == "failed"
    # the dead engine's last report is not what runs now
    assert (stats.engine.running, stats.engine.waiting) == (0, 0)
    assert stats.engine_health.in_flight == 0
    print(f"\nengine killed -> liveness NOT_SERVING {to_not_alive:.2f} s")
