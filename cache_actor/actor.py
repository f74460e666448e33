"""The cache actor: one asyncio task that owns every piece of cache state.

    caller task (actor.py)            actor task (_loop.py): awaits only its mailbox
    ──────────────────────            ──────────────────────────────────────────────
    get(key, compute)
      future = new Future()
      mailbox.offer(Get) ──────────▶  _on_get: stored?  ── yes ─▶ future.set_result(HIT)
      await future (deadline)              │ in flight? ─ yes ─▶ join its waiters (COALESCED)
                                           │ no ────────────────▶ new Flight, spawn compute task
                                                                        │
    compute task (_compute.py, in the caller's context)                 │
      second tier? → compute() → weigh                                  │
      mailbox.post(Done) ──────────▶  _on_done: admit to store, resolve every waiter's future
      write back to the second tier (nobody waits for it)

Handlers are synchronous and touch only memory, so the actor cannot deadlock on itself: a
computation that asks for its own key is refused at once (CacheRecursionError) instead of waiting
on a lock it holds, which is the failure mmgate was built to make impossible.

This module is the callers' side: it builds requests, awaits their futures and reads snapshots;
the state and its handlers live in ``ActorLoop`` (_loop.py).
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, Literal, TypeVar, final

from ._loop import ActorLoop
from ._messages import CLOSE, Fault, Get, Query, WaiterLeft
from .config import CacheConfig
from .errors import CacheActorDead, CacheOverloaded
from .events import CacheEvent, Journal, Watcher, WatchFilter
from .flights import COMPUTING
from .lookup import Lookup, LookupEvent, LookupHook
from .stages import Stage, TierUse
from .stats import CacheStats, EntryInfo
from .store import FullKey
from .tenants import TenantStats
from .tiers import SecondTier

V = TypeVar("V")
T = TypeVar("T")

log = logging.getLogger("cache_actor")

# How long close() waits for cancelled computations to finish before it reports them.
_CLOSE_GRACE_SECONDS = 5.0


@final
class CacheActor:
    """A cache that coalesces identical work and cannot deadlock on itself.

    Use it as ``async with CacheActor(CacheConfig(...)) as cache: await cache.get(key, compute)``.
    One actor holds values of every type; each ``get`` is typed by its own ``compute``.
    """

    def __init__(
        self,
        config: CacheConfig | None = None,
        *,
        tier: SecondTier | None = None,
        hook: LookupHook | None = None,
        journal: Journal | None = None,
    ) -> None:
        self.config = config or CacheConfig()
        self._hook = hook
        self._core = ActorLoop(self.config, tier, journal)
        # the core's own objects, held here too: get() is the hit path, one lookup fewer each
        self._mailbox = self._core.mailbox
        self._waiting = self._core.waiting
        self._loop: asyncio.AbstractEventLoop | None = None

    # ── lifecycle ───────────────────────────────────────────────────────────────────────────

    async def __aenter__(self) -> CacheActor:
        self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def start(self) -> None:
        """Start the actor's task on the running loop."""
        if self._core.task is not None:
            raise RuntimeError("CacheActor already started")
        self._core.start()
        self._loop = self._core.loop

    @property
    def alive(self) -> bool:
        """True while the actor serves lookups: started, not closed, not crashed."""
        return self._core.task is not None and self._core.dead is None

    async def aclose(self) -> None:
        """Stop serving: every pending and later caller gets CacheActorDead; no task is left."""
        core = self._core
        if core.task is None:
            core.dead = core.dead or CacheActorDead("cache actor was never started")
            return
        if not core.task.done():
            self._mailbox.post(CLOSE)
            # the loop ends at the next message; a handler never awaits, so this is quick
            await asyncio.wait({core.task}, timeout=_CLOSE_GRACE_SECONDS)
            if not core.task.done():  # pragma: no cover - would mean a handler blocked the loop
                core.task.cancel()
                await asyncio.wait({core.task}, timeout=_CLOSE_GRACE_SECONDS)
        if core.tasks:
            _, pending = await asyncio.wait(set(core.tasks), timeout=_CLOSE_GRACE_SECONDS)
            for task in pending:
                log.error("computation %s ignored cancellation on close", task.get_name())

    # ── the public lookups ──────────────────────────────────────────────────────────────────

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
        """The value for ``key``, computing it with ``compute`` at most once at a time.

        ``timeout`` bounds this caller's wait (``CacheConfig.default_timeout`` when None); on
        expiry ComputeTimeout is raised and the flight goes on for the others. A computation's
        exception is raised here with its own type, and nothing is stored. ``tier`` is the
        lookup's stage's (``Stage.X.tier_use``): how a miss uses the second tier (the first
        lookup of a flight decides); its stage is what the hook is told of this lookup, and with
        ``label`` (what the value is about) what watchers are told of the entry.
        ``cancel_when_orphaned``: the flight this lookup starts is cancelled, and stores nothing,
        once its last waiter has left (cancelled or timed out), whatever
        ``finish_orphaned_flights`` says; so it runs exactly as long as somebody waits for it,
        to the latest of their deadlines (the first lookup of a flight decides).
        """
        dead = self._core.dead
        if dead is not None or self._loop is None:
            raise dead or CacheActorDead("cache actor is not started")
        loop = self._loop
        hook = self._hook
        token: object | None = None
        started = 0.0
        if hook is not None:
            started = time.perf_counter()
            token = _call_hook(hook.lookup_started, tenant, key, tier.stage)
        full_key = (tenant, key)
        future: asyncio.Future[Lookup[V]] = loop.create_future()
        wait = self.config.default_timeout if timeout is None else timeout
        request = Get(
            full_key,
            compute,
            future,
            contextvars.copy_context(),
            COMPUTING.get(),
            token,
            loop.time() + wait,
            wait,
            tier,
            label,
            cancel_when_orphaned,
        )
        if not self._mailbox.offer(request):
            error: BaseException = CacheOverloaded(
                f"cache mailbox is full ({self.config.mailbox_size} requests queued)"
            )
            self._finish_hook(token, full_key, started, None, error)
            raise error
        waiting = self._waiting
        waiting.add(future)
        try:
            lookup = await future
        except asyncio.CancelledError as exc:
            # cancelled by its own caller: leave the flight, which goes on for the others
            if future.cancelled():
                self._mailbox.post(WaiterLeft(full_key, future, timed_out=False))
            self._finish_hook(token, full_key, started, None, exc)
            raise
        except BaseException as exc:
            self._finish_hook(token, full_key, started, None, exc)
            raise
        finally:
            waiting.discard(future)
        if hook is not None:
            self._finish_hook(token, full_key, started, lookup, None)
        return lookup

    def stats(self) -> CacheStats:
        """A frozen snapshot of counters and gauges."""
        core = self._core
        now = time.monotonic()
        oldest = min((f.started_at for f in core.flights.values()), default=now)
        counts = dataclasses.asdict(core.counters)
        # refused offers are counted by the mailbox itself, the callers never reached the actor
        counts["overloaded"] += self._mailbox.rejected
        return CacheStats(
            **counts,
            entries=len(core.store),
            bytes=core.store.bytes,
            bytes_by_tenant=core.store.bytes_by_tenant(),
            flights=len(core.flights),
            waiters=sum(len(f.waiters) for f in core.flights.values()),
            mailbox_depth=len(self._mailbox),
            loop_lag_seconds=core.watchdog.lag,
            oldest_flight_seconds=now - oldest,
            tier_breaker_open=core.tier is not None and core.tier.breaker_open(now),
            tier_write_queue_depth=0 if core.tier is None else core.tier.queued,
            tier=None if core.tier is None else core.tier.name,
            alive=self.alive,
        )

    def held_by_stage(self) -> tuple[tuple[str, int, int], ...]:
        """(stage, entries, bytes) of each stage with entries held, by stage name; read between
        two messages of the actor, like ``stats()``."""
        return self._core.store.by_stage()

    def tenant_stats(self, tenant: str | None = None) -> tuple[TenantStats, ...]:
        """Each tenant's counts and holdings (``tenant``: that one only, zeros if it has none).

        Read between two messages of the actor, like ``stats()``; reading does not count as use.
        """
        core = self._core
        names = core.tenants.tenants() if tenant is None else (tenant,)
        budget = core.store.tenant_budget
        snapshots = []
        for name in names:
            counts = core.tenants.peek(name)
            entries, nbytes = core.store.held_by(name)
            snapshots.append(
                TenantStats(
                    name,
                    hits=counts.hits,
                    tier_hits=counts.tier_hits,
                    misses=counts.misses,
                    coalesced=counts.coalesced,
                    load_failures=counts.load_failures,
                    entries=entries,
                    bytes=nbytes,
                    budget_bytes=budget,
                )
            )
        return tuple(snapshots)

    async def invalidate(
        self,
        key: str,
        *,
        tenant: str = "default",
        timeout: float = 5.0,
        stage: Stage | None = None,
        local: bool = False,
    ) -> bool:
        """Forget a key in memory and in the second tier; True if memory held it.

        ``stage`` is the key's stage in the tier (None: every stage); ``local`` forgets it in
        memory only (another replica has already removed it from the tier). A flight in progress
        for the key still answers its waiters but stores nothing.
        """
        full_key = (tenant, key)
        core = self._core

        def forget() -> bool:
            flight = core.flights.get(full_key)
            if flight is not None:
                flight.admit = False
            return core.store.remove(full_key)

        removed: bool = await self._ask(forget, timeout)
        if core.tier is not None and not local:
            await core.tier.delete(tenant, key, stage)
        return removed

    def put(
        self, key: str, value: Any, *, tenant: str = "default", stage: Stage = Stage.ANY
    ) -> None:
        """Hand a final value to the second tier (queued, never waited for): for a stage whose
        value becomes final after its lookup (a shared response once it has finished)."""
        tier = self._core.tier
        if tier is not None and tier.allows(time.monotonic()):
            tier.write_back(tenant, key, value, stage)

    async def inspect(
        self, key: str, *, tenant: str = "default", timeout: float = 5.0
    ) -> EntryInfo:
        """What memory holds for a key: a stored value, a flight, or nothing."""
        full_key = (tenant, key)
        core = self._core

        def look() -> EntryInfo:
            now = time.monotonic()
            entry = core.store.peek(full_key)
            if entry is not None:
                expires_in = None if entry.expires_at is None else entry.expires_at - now
                return EntryInfo(
                    tenant,
                    key,
                    "stored",
                    entry.nbytes,
                    now - entry.admitted_at,
                    entry.hits,
                    entry.tier,
                    expires_in,
                )
            flight = core.flights.get(full_key)
            if flight is not None:
                return EntryInfo(
                    tenant,
                    key,
                    "in_flight",
                    age_seconds=now - flight.started_at,
                    waiters=len(flight.waiters),
                )
            return EntryInfo(tenant, key, "absent")

        info: EntryInfo = await self._ask(look, timeout)
        return info

    async def ping(self, timeout: float = 1.0) -> float:
        """Round trip through the mailbox in seconds: the actor's liveness probe.

        Raises CacheActorDead if the actor is gone, TimeoutError if it did not answer in time.
        """
        started = time.perf_counter()
        await self._ask(lambda: None, timeout)
        return time.perf_counter() - started

    async def watch(
        self, watching: WatchFilter, since: int, capacity: int, timeout: float = 5.0
    ) -> tuple[Watcher, list[CacheEvent]]:
        """A watcher of what the store does that ``watching`` admits (its tenants, its stage),
        and what it is owed first: the events after ``since`` while the journal still has them,
        else a snapshot of what is held (events.py). Raises CacheOverloaded beyond the
        journal's watchers."""
        core = self._core
        journal = core.journal
        if journal is None:
            raise RuntimeError("this cache actor has no journal to watch")
        subscribed: tuple[Watcher, list[CacheEvent]] = await self._ask(
            lambda: journal.subscribe(watching, since, capacity, core.store.entries), timeout
        )
        return subscribed

    def inject_fault(self, kind: Literal["crash", "stall"], seconds: float = 0.0) -> None:
        """Fault injection for reliability runs: at its next message the actor's loop crashes
        (every waiter then gets CacheActorDead, as after a bug in a handler), or stops taking
        messages for ``seconds`` (every lookup and ping waits meanwhile, as behind a held-up
        loop). A dead actor ignores it."""
        if self._core.dead is None and self._loop is not None:
            self._mailbox.post(Fault(kind, seconds))

    # ── caller-side helpers ─────────────────────────────────────────────────────────────────

    async def _ask(self, run: Callable[[], T], timeout: float) -> T:
        """Run ``run`` in the actor's loop, between two messages, and return its result."""
        dead = self._core.dead
        if dead is not None or self._loop is None:
            raise dead or CacheActorDead("cache actor is not started")
        future: asyncio.Future[T] = self._loop.create_future()
        self._mailbox.post(Query(run, future))
        async with asyncio.timeout(timeout):
            return await future

    def _finish_hook(
        self,
        token: object | None,
        full_key: FullKey,
        started: float,
        lookup: Lookup[Any] | None,
        error: BaseException | None,
    ) -> None:
        hook = self._hook
        if hook is None:
            return
        event = LookupEvent(
            tenant=full_key[0],
            key=full_key[1],
            outcome=None if lookup is None else lookup.outcome,
            tier=None if lookup is None else lookup.tier,
            wait_seconds=time.perf_counter() - started,
            nbytes=None if lookup is None else lookup.nbytes,
            error=error,
            flight_id=None if lookup is None else lookup.flight_id,
            tier_failure=None if lookup is None else lookup.tier_failure,
            leader_token=None if lookup is None else lookup.leader_token,
        )
        _call_hook(hook.lookup_finished, token, event)


def _call_hook(method: Callable[..., T], *args: Any) -> T | None:
    # observability never fails a lookup: a hook's exception is logged and dropped
    try:
        return method(*args)
    except Exception:
        log.exception("cache lookup hook %r failed", method)
        return None
