"""How the actor talks to its second tier: bounded reads and deletes, background write-backs,
and the circuit breaker's bookkeeping.

Reads and write-backs run in tasks (a flight's, or one of their own), never in the actor's loop;
what they learn reaches the loop as messages (``Done.tier_error``, ``TierWriteFailed``), and only
the loop's handlers touch the breaker and the counters.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any, final

from ._messages import Done, TierWriteFailed
from .mailbox import Mailbox
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
    ) -> None:
        self.tier = tier
        self._timeout = timeout
        self._breaker = breaker
        self._counters = counters
        self._mailbox = mailbox
        # the actor's task spawner: close() cancels and awaits write-backs with the flights
        self._spawn = spawn

    @property
    def name(self) -> str:
        return self.tier.name

    def allows(self, now: float) -> bool:
        return self._breaker.allows(now)

    def breaker_open(self, now: float) -> bool:
        return self._breaker.is_open(now)

    # ── in a flight's task ──────────────────────────────────────────────────────────────────

    async def read(self, tenant: str, key: str) -> tuple[Any, BaseException | None]:
        timeout = self._timeout
        try:
            async with asyncio.timeout(timeout):
                return await self.tier.get(tenant, key, timeout=timeout), None
        except Exception as exc:  # noqa: BLE001 - a tier error is a miss, reported, never raised
            return None, exc

    def write_back(self, tenant: str, key: str, value: Any) -> None:
        """Store a computed value in the second tier without delaying anyone."""
        tier = self.tier
        timeout = self._timeout
        mailbox = self._mailbox

        async def write() -> None:
            try:
                async with asyncio.timeout(timeout):
                    await tier.set(tenant, key, value, timeout=timeout)
            except Exception as exc:  # noqa: BLE001 - reported to the breaker, never raised
                mailbox.post(TierWriteFailed(exc))

        self._spawn(write(), f"cache-write-back-{key[:16]}")

    # ── in the caller's task (invalidate) ───────────────────────────────────────────────────

    async def delete(self, tenant: str, key: str) -> None:
        """Forget a key in the tier; a failure is logged, never raised."""
        try:
            async with asyncio.timeout(self._timeout):
                await self.tier.delete(tenant, key, timeout=self._timeout)
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
        self._counters.tier_write_errors += 1
        self._breaker.record_failure(time.monotonic())
        log.warning("second tier write failed: %r", failed.error)
