"""How the actor talks to its second tier: bounded reads and deletes, background write-backs,
and the circuit breaker's bookkeeping.

    read     in the flight's task, within tier_timeout; an error or timeout is a miss
    write    queued (tier_write_queue; beyond it dropped, counted) ─▶ tier_writers tasks ─▶ set
    delete   in the caller's task (invalidate), within tier_timeout; logged, never raised

Reads and writes run in tasks (a flight's, or the writers), never in the actor's loop; what they
learn reaches the loop as messages (``Done.tier_error``, ``TierWriteFailed``), and only the loop's
handlers touch the breaker and the counters. Only reads feed the breaker: a tier that refuses
writes (Redis at maxmemory) still serves what it holds.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any, final

from ._messages import Done, TierWriteFailed
from .mailbox import Mailbox
from .stages import Stage
from .stats import Counters
from .tiers import CircuitBreaker, SecondTier

log = logging.getLogger("cache_actor")

Spawn = Callable[[Coroutine[Any, Any, None], str], object]


@final
class TierIO:
    def __init__(
        self,
        tier: SecondTier,
        *,
        timeout: float,
        breaker: CircuitBreaker,
        counters: Counters,
        mailbox: Mailbox,
        spawn: Spawn,
        write_queue: int,
        writers: int,
    ) -> None:
        self.tier = tier
        self._timeout = timeout
        self._breaker = breaker
        self._counters = counters
        self._mailbox = mailbox
        # the actor's task spawner: close() cancels and awaits the writers with the flights
        self._spawn = spawn
        self._writes: asyncio.Queue[tuple[str, str, Any, Stage]] = asyncio.Queue(write_queue)
        self._writers = writers
        self._started = False
        self._last_write: type | None = None  # a run of the same write error is logged once

    @property
    def name(self) -> str:
        return self.tier.name

    def allows(self, now: float) -> bool:
        return self._breaker.allows(now)

    def breaker_open(self, now: float) -> bool:
        return self._breaker.is_open(now)

    # ── in a flight's task ──────────────────────────────────────────────────────────────────

    async def read(self, tenant: str, key: str, stage: Stage) -> tuple[Any, BaseException | None]:
        timeout = self._timeout
        try:
            async with asyncio.timeout(timeout):
                return await self.tier.get(tenant, key, stage=stage, timeout=timeout), None
        except Exception as exc:  # noqa: BLE001 - a tier error is a miss, reported, never raised
            return None, exc

    def write_back(self, tenant: str, key: str, value: Any, stage: Stage) -> None:
        """Queue a value for the tier without delaying anyone; dropped (counted) when full."""
        if not self._started:
            self._started = True
            for number in range(self._writers):
                self._spawn(self._write(), f"cache-tier-writer-{number}")
        try:
            self._writes.put_nowait((tenant, key, value, stage))
        except asyncio.QueueFull:
            self._counters.tier_write_drops += 1

    @property
    def queued(self) -> int:
        return self._writes.qsize()

    async def _write(self) -> None:
        tier, timeout, writes = self.tier, self._timeout, self._writes
        while True:
            tenant, key, value, stage = await writes.get()
            try:
                async with asyncio.timeout(timeout):
                    await tier.set(tenant, key, value, stage=stage, timeout=timeout)
            except Exception as exc:  # noqa: BLE001 - counted, never raised
                self._mailbox.post(TierWriteFailed(exc))
            finally:
                del value  # the queue held the only other reference

    # ── in the caller's task (invalidate) ───────────────────────────────────────────────────

    async def delete(self, tenant: str, key: str, stage: Stage | None) -> None:
        """Forget a key in the tier; a failure is logged, never raised."""
        try:
            async with asyncio.timeout(self._timeout):
                await self.tier.delete(tenant, key, stage=stage, timeout=self._timeout)
        except Exception:
            log.warning("second tier %s: delete of %s failed", self.name, key, exc_info=True)

    # ── in the actor's loop ─────────────────────────────────────────────────────────────────

    def record_read(self, done: Done) -> None:
        if done.tier_error is not None:
            self._counters.tier_errors += 1
            self._breaker.record_failure(time.monotonic())
            log.warning(
                "second tier read failed for %s: %r", done.flight.full_key[1], done.tier_error
            )
        else:
            self._breaker.record_success()

    def on_write_failed(self, failed: TierWriteFailed) -> None:
        # counted apart, and not the breaker's business: reads may well still work
        self._counters.tier_write_errors += 1
        if self._counters.tier_write_errors == 1 or failed.error.__class__ is not self._last_write:
            log.warning("second tier write failed: %r", failed.error)
        self._last_write = failed.error.__class__
