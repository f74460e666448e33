"""The cache as the service uses it: the actor, and what a request does when the actor cannot
answer (MMGATE_CACHE__ON_FAILURE).

    stage ─▶ front.get(key, compute, tier=Stage.X.tier_use) ─▶ actor.get ─▶ hit | miss | coalesced
                  │                         │
                  │  dead (CacheActorDead) ─┤─▶ replaced by a fresh, empty actor (at most
                  │                         │   MAX_REPLACEMENTS in REPLACEMENT_WINDOW seconds)
                  │  stalled (the health    │
                  │  monitor's ping failed) ┘
                  └─▶ "compute": compute() here, for this request alone: no coalescing, no
                      storing ("bypass", with the reason, in the report and the span)
                      "fail": the error, as before degraded mode (UNAVAILABLE)

A full mailbox stays RESOURCE_EXHAUSTED in both: that is overload, not a fault, and computing
without coalescing would make it worse. The computations run where they always do (the stage
thread pools, inside the request's admission), so a degraded replica is slower, never unbounded.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, TypeVar, final

from prometheus_client.core import Metric

from cache_actor import (
    CacheActor,
    CacheActorDead,
    CacheConfig,
    CacheEvent,
    CacheStats,
    ComputeTimeout,
    EntryInfo,
    Journal,
    Lookup,
    LookupHook,
    Outcome,
    Stage,
    TenantStats,
    TierUse,
    Watcher,
    WatchFilter,
    WatchStats,
)

from ..config import Settings
from ..observability.degraded_metrics import DegradedStats, degraded_families
from ..observability.lookups import Observers, stage_label
from ..observability.metric_families import actor_families
from ..observability.spans import span
from ..observability.tracing import key_digest
from ..storage.redis_tier import RedisTier

log = logging.getLogger("mmgate.cache")

V = TypeVar("V")

# A dead actor is replaced at most this many times in this many seconds; one more death and
# liveness fails, so that the orchestrator restarts the pod.
MAX_REPLACEMENTS: Final = 3
REPLACEMENT_WINDOW: Final = 600.0

Reason = Literal["cache_dead", "cache_stalled"]


@final
@dataclass(frozen=True, slots=True)
class Bypassed(Lookup[V]):
    """A value the request computed itself because the actor could not answer."""

    reason: str = ""


def outcome_of(lookup: Lookup[Any]) -> tuple[str, str]:
    """What a request's report says of a lookup: its outcome, and why it was bypassed."""
    if isinstance(lookup, Bypassed):
        return "bypass", lookup.reason
    return lookup.outcome.value, ""


def cache_front(
    settings: Settings,
    tier: RedisTier | None,
    *,
    tenant_bytes: int | None,
    hooks: Sequence[LookupHook | None],
) -> CacheFront:
    """The service's cache: an actor over ``tier`` (None: this replica alone) seen by ``hooks``
    (tracing, metrics), and a fresh one in its place if it dies (degraded mode, below)."""
    config = settings.cache.actor_config(
        settings.redis if tier is not None else None,
        tenant_bytes=tenant_bytes,
        max_tenants=settings.tenants.max_labels,
    )
    seen = [hook for hook in hooks if hook is not None]
    hook = Observers(seen) if seen else None
    journal = Journal(settings.cache.watch_history, settings.cache.max_watchers)
    return CacheFront(
        lambda: CacheActor(config, hook=hook, tier=tier, journal=journal),
        settings.cache.on_failure,
        journal=journal,
    )


@final
class CacheFront:
    """The current cache actor and the service's policy when it cannot answer."""

    def __init__(
        self,
        make: Callable[[], CacheActor],
        on_failure: Literal["compute", "fail"] = "compute",
        clock: Callable[[], float] = time.monotonic,
        journal: Journal | None = None,
    ) -> None:
        # what the store does, for watchers (the one ``make`` hands each actor): it outlives
        # each actor, and a replacement resets it
        self.journal = journal
        self._make = make
        self.on_failure = on_failure
        self.clock = clock
        self.actor = make()
        self.stalled = False
        self.replaced: collections.deque[float] = collections.deque()  # when, recent ones
        self.replacements = 0
        self.exhausted = False  # dead once more than the replacements allow: liveness fails
        self.bypassed: collections.Counter[tuple[str, str]] = collections.Counter()
        self._stall: asyncio.Future[None] | None = None
        self.closing = False  # shutting down: a closed actor is not replaced

    # ── state ───────────────────────────────────────────────────────────────────────────────

    @property
    def degraded(self) -> Reason | None:
        """Why lookups are computed without the cache now (None: the actor answers)."""
        if not self.actor.alive:
            return "cache_dead"
        return "cache_stalled" if self.stalled else None

    def start(self) -> None:
        self.actor.start()

    def found_stalled(self) -> None:
        """The health monitor's ping went unanswered: lookups waiting on the actor, and those
        to come, compute for themselves until it answers again."""
        if self.stalled or not self.actor.alive:
            return
        self.stalled = True
        log.error(
            "cache actor not answering: %s until it does",
            "requests compute without the cache"
            if self.on_failure == "compute"
            else "requests fail and liveness fails",
        )
        if self._stall is not None and not self._stall.done():
            self._stall.set_result(None)

    def found_answering(self) -> None:
        if self.stalled:
            self.stalled = False
            self._stall = None
            log.warning("cache actor answering again: requests use the cache")

    def found_dead(self, actor: CacheActor | None = None) -> None:
        """``actor`` (the current one when None) has died: replace it while the window allows."""
        dead = actor or self.actor
        if dead is not self.actor or dead.alive or self.exhausted or self.closing:
            return
        now = self.clock()
        while self.replaced and now - self.replaced[0] > REPLACEMENT_WINDOW:
            self.replaced.popleft()
        lost = dead.stats()
        if self.on_failure == "fail" or len(self.replaced) >= MAX_REPLACEMENTS:
            self.exhausted = True
            log.critical(
                "cache actor died%s: liveness fails",
                f" for the {MAX_REPLACEMENTS + 1}th time in {REPLACEMENT_WINDOW / 60:.0f} minutes"
                if self.on_failure == "compute"
                else "",
            )
            return
        self.replaced.append(now)
        self.replacements += 1
        if self.journal is not None:
            self.journal.reset()  # watchers start over: what they were told of is gone
        self.stalled = False
        self._stall = None
        self.actor = self._make()
        self.actor.start()
        log.error(
            "cache actor died; replaced by an empty one (%d of %d in %.0f minutes): lost %d "
            "entries (%d bytes) and %d computations in flight, which are computed again",
            len(self.replaced),
            MAX_REPLACEMENTS,
            REPLACEMENT_WINDOW / 60,
            lost.entries,
            lost.bytes,
            lost.flights,
        )

    def figures(self) -> DegradedStats:
        return DegradedStats(self.degraded is not None, self.replacements, dict(self.bypassed))

    def watch_figures(self) -> WatchStats:
        """The journal's own counts of its watchers (none without a journal)."""
        return WatchStats() if self.journal is None else self.journal.figures()

    # ── lookups ─────────────────────────────────────────────────────────────────────────────

    async def get(
        self,
        key: str,
        compute: Callable[[], Awaitable[V]],
        *,
        tenant: str = "default",
        timeout: float | None = None,
        tier: TierUse = Stage.ANY.tier_use,
        label: str = "",
        cancel_when_orphaned: bool = False,
    ) -> Lookup[V]:
        """The actor's lookup; where it cannot answer and the policy is "compute", the value
        computed for this caller alone (a ``Bypassed`` lookup, which ends with its caller)."""
        if self.on_failure == "fail":
            return await self.actor.get(
                key,
                compute,
                tenant=tenant,
                timeout=timeout,
                tier=tier,
                label=label,
                cancel_when_orphaned=cancel_when_orphaned,
            )
        loop = asyncio.get_running_loop()
        wait = self.actor.config.default_timeout if timeout is None else timeout
        deadline = loop.time() + wait
        if not self.actor.alive:
            self.found_dead()  # noticed before the health monitor: replaced now, if it may be
        actor, reason = self.actor, self.degraded
        if reason is None:
            if self._stall is None:
                self._stall = loop.create_future()
            stall = self._stall
            lookup = asyncio.ensure_future(
                actor.get(
                    key,
                    compute,
                    tenant=tenant,
                    timeout=wait,
                    tier=tier,
                    label=label,
                    cancel_when_orphaned=cancel_when_orphaned,
                )
            )
            # its outcome is read below, unless this caller leaves first
            lookup.add_done_callback(_retrieve)
            try:
                await asyncio.wait((lookup, stall), return_when=asyncio.FIRST_COMPLETED)
            finally:
                if not lookup.done():
                    lookup.cancel()  # it leaves the flight, which goes on for the others
            if lookup.done() and not lookup.cancelled():
                try:
                    return lookup.result()
                except CacheActorDead:
                    self.found_dead(actor)
                    reason = "cache_dead"
            else:
                reason = "cache_stalled"
        return await self._bypass(key, compute, tenant, tier.stage, reason, deadline, wait)

    async def _bypass(
        self,
        key: str,
        compute: Callable[[], Awaitable[V]],
        tenant: str,
        named: Stage,
        reason: Reason,
        deadline: float,
        wait: float,
    ) -> Bypassed[V]:
        """``compute()`` in this caller's task, bounded by its wait as a lookup would be."""
        stage = stage_label(named)  # as the hooks would have named it
        self.bypassed[stage, reason] += 1
        attributes: dict[str, str] = {
            "mmgate.cache.key": key_digest(key),
            "mmgate.cache.stage": stage,
            "mmgate.cache.tenant": tenant,
            "mmgate.cache.outcome": "bypass",
            "mmgate.cache.bypass_reason": reason,
        }
        with span("cache.lookup", attributes):
            try:
                async with asyncio.timeout_at(deadline):
                    value = await compute()
            except TimeoutError:
                raise ComputeTimeout(
                    f"no value for {key!r} within the caller's {wait:g} s"
                ) from None
        return Bypassed(value, Outcome.MISS, None, 0, reason=reason)

    # ── the rest of the actor's interface ──────────────────────────────────────────────────

    def put(
        self, key: str, value: Any, *, tenant: str = "default", stage: Stage = Stage.ANY
    ) -> None:
        if self.degraded is None:
            self.actor.put(key, value, tenant=tenant, stage=stage)

    async def invalidate(
        self,
        key: str,
        *,
        tenant: str = "default",
        timeout: float = 5.0,
        stage: Stage | None = None,
        local: bool = False,
    ) -> bool:
        actor = self.actor
        try:
            return await actor.invalidate(
                key, tenant=tenant, timeout=timeout, stage=stage, local=local
            )
        except CacheActorDead:
            self.found_dead(actor)
            if self.actor is actor:
                raise  # not replaced ("fail", or too many deaths)
        # a dead actor's entries are gone with it; the fresh one still drops the second tier's
        return await self.actor.invalidate(
            key, tenant=tenant, timeout=timeout, stage=stage, local=local
        )

    async def forget_copy(self, tenant: str, key: str) -> None:
        """Another replica invalidated a key: drop this replica's memory copy (the second tier's
        listener calls it)."""
        await self.invalidate(key, tenant=tenant, local=True)

    async def inspect(
        self, key: str, *, tenant: str = "default", timeout: float = 5.0
    ) -> EntryInfo:
        return await self.actor.inspect(key, tenant=tenant, timeout=timeout)

    async def ping(self, timeout: float = 1.0) -> float:
        return await self.actor.ping(timeout)

    @property
    def config(self) -> CacheConfig:
        return self.actor.config

    def stats(self) -> CacheStats:
        return self.actor.stats()

    def collect(self) -> Iterator[Metric]:
        """The actor's figures, its replacements and bypasses, Cache.Watch's (metrics.py)."""
        yield from actor_families(self.stats(), self.config.mailbox_size)
        yield from degraded_families(self.figures(), self.watch_figures())

    def tenant_stats(self, tenant: str | None = None) -> tuple[TenantStats, ...]:
        return self.actor.tenant_stats(tenant)

    def held_by_stage(self) -> tuple[tuple[str, int, int], ...]:
        return self.actor.held_by_stage()

    async def watch(
        self, watching: WatchFilter, since: int, capacity: int
    ) -> tuple[Watcher, list[CacheEvent]]:
        if not self.actor.alive:
            self.found_dead()  # replaced now, if it may be: a fresh actor is watched
        if self.stalled:  # it would not answer: the caller is told so now (UNAVAILABLE)
            raise CacheActorDead("the cache actor is not answering")
        return await self.actor.watch(watching, since, capacity)

    def inject_fault(self, kind: Literal["crash", "stall"], seconds: float = 0.0) -> None:
        self.actor.inject_fault(kind, seconds)

    async def aclose(self) -> None:
        self.closing = True
        await self.actor.aclose()


def _retrieve(lookup: asyncio.Future[Any]) -> None:
    """Mark a lookup's failure as seen: its caller may have left before reading it."""
    if not lookup.cancelled():
        lookup.exception()


__all__ = ["MAX_REPLACEMENTS", "REPLACEMENT_WINDOW", "Bypassed", "CacheFront", "outcome_of"]
