import asyncio
import logging
import time

import pytest

from cache_actor import CacheActor, CacheActorDead, CacheConfig

from .conftest import Gate, MakeActor


class Captured(logging.Handler):
    """Collects records of the cache_actor logger and signals each one."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []
        self.arrived = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        self.arrived.set()


@pytest.fixture
def captured() -> object:
    handler = Captured()
    logger = logging.getLogger("cache_actor")
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)


async def stalled_image_decode(gate: Gate) -> bytes:
    value: bytes = await gate()
    return value


async def test_stalled_flight_is_logged_with_its_stack(
    make_actor: MakeActor, captured: Captured
) -> None:
    cache = make_actor(CacheConfig(watchdog_interval=0.01, stall_threshold=0.02))
    gate = Gate()
    lookup = asyncio.ensure_future(cache.get("img", lambda: stalled_image_decode(gate)))
    async with asyncio.timeout(5):
        await captured.arrived.wait()
    message = captured.records[0].getMessage()
    assert "img" in message
    assert "stalled_image_decode" in message  # the stack shows where the computation waits
    assert cache.stats().stalled_flights == 1
    assert cache.stats().oldest_flight_seconds >= 0.02
    gate.release.set()
    await lookup


async def test_ping_answers_through_the_mailbox(cache: CacheActor[bytes]) -> None:
    round_trip = await cache.ping(timeout=1)
    assert 0 < round_trip < 1
    await cache.aclose()
    with pytest.raises(CacheActorDead):
        await cache.ping()


async def test_loop_lag_is_measured_and_reported(make_actor: MakeActor, captured: Captured) -> None:
    cache = make_actor(CacheConfig(watchdog_interval=0.01, loop_lag_warning=0.05))
    busy_until = time.perf_counter() + 0.1
    while time.perf_counter() < busy_until:  # CPU-bound work on the event loop, as a bug would
        pass
    async with asyncio.timeout(5):
        await captured.arrived.wait()
    record = captured.records[0]
    assert "event loop lagged" in record.getMessage()
    assert isinstance(record.args, tuple)
    lag = record.args[0]
    assert isinstance(lag, float)
    assert lag >= 0.05
    assert cache.stats().loop_lag_seconds >= 0.0
