import asyncio
import logging
import time
from collections.abc import Callable, Iterator

import pytest

from cache_actor import CacheActor, CacheActorDead, CacheConfig, CacheStats
from tests.cache_actor.stats_check import MakeActor
from tests.support import Gate


class Captured(logging.Handler):
    """Collects records of the cache_actor logger and signals each one.

    With ``stats`` set it also takes a snapshot as each record is logged: by the time the test
    reads a record, later ticks may have moved the gauges on.
    """

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []
        self.arrived = asyncio.Event()
        self.stats: Callable[[], CacheStats] | None = None
        self.stats_at_record: list[CacheStats] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        if self.stats is not None:
            self.stats_at_record.append(self.stats())
        self.arrived.set()


@pytest.fixture
def captured() -> Iterator[Captured]:
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


async def test_ping_answers_through_the_mailbox(cache: CacheActor) -> None:
    round_trip = await cache.ping(timeout=1)
    assert 0 < round_trip < 1
    await cache.aclose()
    with pytest.raises(CacheActorDead):
        await cache.ping()


async def test_loop_lag_is_measured_and_reported(make_actor: MakeActor, captured: Captured) -> None:
    interval, blocked = 0.01, 0.2
    cache = make_actor(CacheConfig(watchdog_interval=interval, loop_lag_warning=blocked / 2))
    captured.stats = cache.stats
    # Block this test's own loop, as CPU-bound work on it would. The watchdog's first tick was
    # due `interval` after start and cannot fire before the sleep ends, so its lag is at least
    # `blocked - interval` however loaded the machine is (a lower bound only: never flaky).
    time.sleep(blocked)  # noqa: ASYNC251 - blocking the loop is what this test measures
    async with asyncio.timeout(5):
        await captured.arrived.wait()
    record = captured.records[0]
    assert "event loop lagged" in record.getMessage()
    assert isinstance(record.args, tuple)
    lag = record.args[0]
    assert isinstance(lag, float)
    assert lag >= blocked - interval
    # the gauge holds the same measurement (read as it was logged: a later tick replaces it)
    assert captured.stats_at_record[0].loop_lag_seconds == lag
