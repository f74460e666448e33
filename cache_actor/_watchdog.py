"""The actor's watchdog: every ``watchdog_interval`` it measures loop lag, sweeps expired entries
and reports flights stalled past ``stall_threshold`` with the stack they wait in.

    loop timer (due = now + interval) ── fires late by `lag` ──▶ mailbox.post(Tick(lag))
                                                                       │
                                      actor's loop: on_tick ◀──────────┘
                                        lag gauge, warning, store.expire(), stalled flights

The timer measures the lag (how late the event loop ran it); the sweep and the report run as a
message, so they touch the actor's state between two handlers like everything else.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import final

from ._messages import Tick
from .config import CacheConfig
from .flights import Flight
from .mailbox import Mailbox
from .stacks import await_stack
from .stats import Counters
from .store import FullKey, Store

log = logging.getLogger("cache_actor")


@final
class Watchdog:
    def __init__(
        self,
        config: CacheConfig,
        *,
        mailbox: Mailbox,
        store: Store,
        flights: dict[FullKey, Flight],
        counters: Counters,
    ) -> None:
        self._config = config
        self._mailbox = mailbox
        self._store = store
        self._flights = flights
        self._counters = counters
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._stopped = False
        # the last tick's lag: the loop_lag_seconds gauge
        self.lag = 0.0

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._schedule()

    def stop(self) -> None:
        self._stopped = True
        if self._timer is not None:
            self._timer.cancel()

    def on_tick(self, tick: Tick) -> None:
        self.lag = tick.lag
        if tick.lag >= self._config.loop_lag_warning:
            # something blocked the event loop: every lookup and every RPC waited that long
            log.warning("event loop lagged %.3f s behind the cache watchdog", tick.lag)
        now = time.monotonic()
        self._store.expire()
        threshold = self._config.stall_threshold
        for flight in self._flights.values():
            age = now - flight.started_at
            if age < threshold or flight.stall_reported:
                continue
            flight.stall_reported = True
            self._counters.stalled_flights += 1
            stack = "" if flight.task is None else await_stack(flight.task)
            log.warning(
                "flight %d for %s has run %.1f s with %d waiters; its task is at:\n%s",
                flight.id,
                flight.full_key[1],
                age,
                len(flight.waiters),
                stack,
            )

    def _schedule(self) -> None:
        loop = self._loop
        assert loop is not None
        due = loop.time() + self._config.watchdog_interval
        self._timer = loop.call_at(due, self._post_tick, due)

    def _post_tick(self, due: float) -> None:
        assert self._loop is not None
        # how late the timer fired: the event loop's lag, which also delays every message
        self._mailbox.post(Tick(max(0.0, self._loop.time() - due)))
        if not self._stopped:
            self._schedule()
