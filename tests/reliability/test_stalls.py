"""Stalls, on the chaos server (short watchdog thresholds, see conftest.py): a cache flight that
never finishes, the event loop blocked, the engine core stopped (SIGSTOP), continued (SIGCONT) and
killed (SIGKILL). Each is detected within its configured time, the caller reads mmgate's words,
and each recovers; the detection times go to docs/reliability.md.

    flight   decode stalls (chaos) ─▶ stall detector logs it ─▶ caller DEADLINE_EXCEEDED
             ─▶ compute deadline cancels it ─▶ nothing left; the image decodes for the next one
    loop     a request blocks the loop (chaos) ─▶ /metrics says so from its thread ─▶ logged
             with the stack ─▶ readiness NOT_SERVING ─▶ SERVING after loop_recover_seconds
    engine   SIGSTOP ─▶ readiness NOT_SERVING ─▶ liveness NOT_SERVING (hung) ─▶ SIGCONT ─▶
             SERVING, the stream finishes; SIGKILL ─▶ liveness NOT_SERVING, UNAVAILABLE
"""

from __future__ import annotations

import asyncio
import threading
import time
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc
import pytest
from grpc_health.v1 import health_pb2

from services.cli.bench.workload import Mix, Workload
from services.client import MmgateClient, build_request, digest_of
from services.proto.mmgate.v1 import cache_pb2, inference_pb2
from tests.services.prom import scrape
from tests.support import RunningServer, engine_core, eventually, hand_to_stopped_core

from .conftest import (
    BLOCK_SECONDS,
    BLOCK_TENANT,
    COMPUTE_DEADLINE_SECONDS,
    ENGINE_HUNG_SECONDS,
    ENGINE_STALL_SECONDS,
    FLIGHT_STALL_SECONDS,
    LOOP_BLOCK_SECONDS,
    LOOP_RECOVER_SECONDS,
    STALL_TENANT,
    StallResults,
)

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@pytest.fixture
async def client(chaos_server: RunningServer) -> AsyncIterator[MmgateClient]:
    async with chaos_server.client(timeout=60.0, retries=False) as client:
        yield client


def status_is(client: MmgateClient, service: str, wanted: int) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return await client.health(service) == wanted

    return check


async def test_a_flight_that_never_finishes_is_reported_cancelled_and_leaves_nothing(
    chaos_server: RunningServer,
    client: MmgateClient,
    stall_results: StallResults,
) -> None:
    image = Workload(Mix(image_ratio=1.0, image_repeat=0.0, seed=41)).next().request
    async with chaos_server.client(tenant=STALL_TENANT, timeout=60.0, retries=False) as stalled:
        before = (await client.stats()).actor
        sent = time.monotonic()
        call = asyncio.ensure_future(stalled.complete_request(image, timeout=8.0))

        async def reported() -> bool:
            return (await client.stats()).actor.stalled_flights > before.stalled_flights

        await eventually(reported, timeout=30)
        to_report = time.monotonic() - sent
        with pytest.raises(grpc.aio.AioRpcError) as ended:
            await call
        to_end = time.monotonic() - sent
        # the compute deadline ends the flight before the caller's deadline
        assert ended.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert "Error" not in (ended.value.details() or "")

        async def nothing_left() -> bool:
            actor = (await client.stats()).actor
            return actor.flights == 0 and actor.waiters == 0

        await eventually(nothing_left, timeout=30)
        after = (await client.stats()).actor
        # the image flight, and the encoder's flight that waited on it
        assert after.compute_timeouts > before.compute_timeouts
        # nothing stored for the stalled image: the next request decodes afresh
        digest = digest_of(image.images[0].data)
        inspected = await stalled.cache.Inspect(
            cache_pb2.InspectRequest(digest=digest), metadata=stalled.metadata, timeout=10
        )
        states = {entry.stage: entry.state for entry in inspected.stages}
        assert states == {"image": "absent", "embedding": "absent"}
        # the log says which flight and where it waits: in the injected stall
        log = chaos_server.log(400)
        assert "has run" in log
        assert "inject" in log
        # the same image, from a tenant without faults: decoded, nothing poisoned
        answer = await client.complete_request(image, timeout=30)
        assert answer.final.usage.completion_tokens > 0
    assert to_report <= FLIGHT_STALL_SECONDS + 1.0 + 1.0  # threshold + watchdog interval + poll
    assert to_end == pytest.approx(COMPUTE_DEADLINE_SECONDS, abs=1.5)
    stall_results["flight"] = {
        "threshold_seconds": FLIGHT_STALL_SECONDS,
        "reported_seconds": round(to_report, 2),
        "compute_deadline_seconds": COMPUTE_DEADLINE_SECONDS,
        "caller_ended_seconds": round(to_end, 2),
        "caller_status": ended.value.code().name,
        "entries_after": states,
    }


def blocked_gauge(url: str) -> float | None:
    with urllib.request.urlopen(url, timeout=10) as response:
        for line in response.read().decode().splitlines():
            if line.startswith("mmgate_event_loop_blocked "):
                return float(line.split()[1])
    return None


async def test_a_blocked_loop_is_seen_from_a_thread_and_recovers(
    chaos_server: RunningServer,
    client: MmgateClient,
    stall_results: StallResults,
) -> None:
    url = chaos_server.metrics_url
    assert await client.health("readiness") == SERVING
    blocks_before = (await scrape(url)).value("mmgate_event_loop_blocks_total")
    seen: dict[str, float] = {}
    done = threading.Event()

    def scrape_until_blocked() -> None:
        while not done.is_set() and time.monotonic() - seen["sent"] < 30:
            if blocked_gauge(url) == 1:
                seen["gauge"] = time.monotonic() - seen["sent"]
                return

    async with chaos_server.client(tenant=BLOCK_TENANT, timeout=60.0, retries=False) as blocking:
        seen["sent"] = time.monotonic()
        scraper = threading.Thread(target=scrape_until_blocked)
        scraper.start()
        try:
            # the request itself is answered once the loop moves again
            answer = await blocking.complete("Say hi", max_tokens=2)
        finally:
            done.set()
            await asyncio.to_thread(scraper.join, 30)
    assert answer.final.usage.completion_tokens > 0
    # seen while the loop was still stuck: the block lasts BLOCK_SECONDS
    assert "gauge" in seen, "/metrics never said the loop was blocked"
    assert seen["gauge"] < BLOCK_SECONDS
    assert await client.health("readiness") == NOT_SERVING  # the first answer once it moves
    recovered = await eventually(status_is(client, "readiness", SERVING), timeout=30)
    metrics = await scrape(url)
    assert metrics.value("mmgate_event_loop_blocks_total") == blocks_before + 1
    assert metrics.value("mmgate_event_loop_blocked") == 0
    log = chaos_server.log(400)
    assert "event loop blocked" in log
    assert "_block_the_event_loop" in log
    assert "time.sleep(seconds)" in log
    assert recovered >= LOOP_RECOVER_SECONDS * 0.5
    stall_results["loop"] = {
        "block_seconds": BLOCK_SECONDS,
        "threshold_seconds": LOOP_BLOCK_SECONDS,
        "seen_seconds": round(seen["gauge"], 2),
        "recover_seconds": LOOP_RECOVER_SECONDS,
        "serving_again_seconds": round(recovered, 2),
    }


def long_request() -> inference_pb2.GenerateRequest:
    request = build_request("Tell a long story", max_tokens=900, temperature=0.0)
    request.sampling.ignore_eos = True
    request.request_id = "long-story"
    return request


async def test_a_stopped_engine_turns_health_not_serving_and_back(
    chaos_server: RunningServer,
    client: MmgateClient,
    stall_results: StallResults,
) -> None:
    """The core is stopped, then a request is handed to it: the engine owes a step from then on.
    (Stopped once the first token had come, the core could already have generated all 900 on a
    loaded 2-core host, whose server relays tokens later than the core makes them: then nothing
    was in flight and the stop went unseen.)"""
    core = engine_core(chaos_server)
    assert core is not None, chaos_server.log()
    stalls_before = (await client.stats()).engine_health.stalls
    try:
        sent = time.monotonic()  # the engine owes a step from about now
        call = await hand_to_stopped_core(core, client, long_request(), timeout=120)
        await eventually(status_is(client, "readiness", NOT_SERVING), timeout=30)
        to_not_ready = time.monotonic() - sent
        # stalled, not yet hung: the process is still worth keeping
        assert await client.health("liveness") == SERVING
        stats = await client.stats()
        assert stats.engine_health.state == "stalled"
        assert stats.engine_health.in_flight == 1
        assert stats.engine_health.seconds_since_step >= ENGINE_STALL_SECONDS

        await eventually(status_is(client, "liveness", NOT_SERVING), timeout=30)
        to_not_alive = time.monotonic() - sent
        assert (await client.stats()).engine_health.state == "hung"
    finally:
        resumed = time.monotonic()
        core.resume()
    await eventually(status_is(client, "readiness", SERVING), timeout=30)
    to_ready = time.monotonic() - resumed
    assert await client.health("liveness") == SERVING
    # the caller's stream was only delayed: it goes on to its end
    finals = [event async for event in call if event.HasField("final")]
    assert finals[0].final.usage.completion_tokens == 900

    health = (await client.stats()).engine_health
    assert (health.state, health.in_flight) == ("serving", 0)
    # the stop was counted; a core catching up on a loaded host may be seen stalling once more
    assert stalls_before + 1 <= health.stalls <= stalls_before + 2
    log = chaos_server.log(400)
    assert "engine stalled: no engine step for" in log
    assert "('long-story')" in log  # the log names what is waiting, by the caller's label
    assert "engine stepping again" in log
    assert to_not_ready <= ENGINE_STALL_SECONDS + 1.0
    assert to_not_alive <= ENGINE_HUNG_SECONDS + 1.0
    stall_results["engine"] = {
        "stall_seconds": ENGINE_STALL_SECONDS,
        "not_ready_seconds": round(to_not_ready, 2),
        "hung_seconds": ENGINE_HUNG_SECONDS,
        "not_alive_seconds": round(to_not_alive, 2),
        "serving_again_seconds": round(to_ready, 2),
        "stream_tokens_after": finals[0].final.usage.completion_tokens,
    }


@pytest.mark.ends_server
async def test_a_killed_engine_fails_liveness(
    chaos_server: RunningServer,
    client: MmgateClient,
    stall_results: StallResults,
) -> None:
    core = engine_core(chaos_server)
    assert core is not None
    # stopped, then handed a request: it is in flight when the core dies (the tiny model could
    # otherwise have finished it before the kill, whatever the caller had seen of it)
    call = await hand_to_stopped_core(core, client, long_request(), timeout=120)
    killed = time.monotonic()
    core.kill()
    await eventually(status_is(client, "liveness", NOT_SERVING), timeout=30)
    to_not_alive = time.monotonic() - killed
    assert await client.health("readiness") == NOT_SERVING

    # the request in flight ends with mmgate's words, as does a new one
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
    stall_results["engine_killed"] = {
        "not_alive_seconds": round(to_not_alive, 2),
        "caller_status": running.value.code().name,
    }
