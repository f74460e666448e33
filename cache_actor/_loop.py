"""The actor's task: the state it owns, the loop that reads its mailbox, one handler per message.

Every handler is synchronous and touches only memory; anything slow runs in a task spawned here
(``run_flight``, a tier write-back) whose outcome comes back as a message. That is why the loop
cannot deadlock on itself. Only this task mutates the state; ``CacheActor`` reads it for its
snapshots, and changes it only through a ``Query`` run here.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable, Coroutine
from contextvars import Context
from typing import Any, final

from ._compute import run_flight
from ._messages import (
    CLOSE,
    DeadlinePassed,
    Done,
    Fault,
    Get,
    Query,
    Tick,
    TierWriteFailed,
    WaiterLeft,
)
from ._tier_io import TierIO
from ._watchdog import Watchdog
from .config import CacheConfig
from .errors import CacheActorDead, CacheError, CacheOverloaded, CacheRecursionError, ComputeTimeout
from .events import Journal
from .flights import COMPUTING, Flight, Waiter
from .lookup import Lookup, Outcome
from .mailbox import Mailbox
from .stats import Counters
from .store import FullKey, Store
from .tenants import TenantLedger
from .tiers import CircuitBreaker, SecondTier

log = logging.getLogger("cache_actor")


class _Closed(Exception):
    """Raised inside the actor's loop to end it on close()."""


class InjectedCrash(Exception):
    """Raised inside the actor's loop by a "crash" fault: the crash path, as for a bug."""


@final
class ActorLoop:
    def __init__(
        self, config: CacheConfig, tier: SecondTier | None, journal: Journal | None = None
    ) -> None:
        self.config = config
        self.journal = journal
        self.counters = Counters()
        self.tenants = TenantLedger(config.max_tenants)
        self.store = Store(
            max_bytes=config.max_bytes,
            tenant_budget=config.tenant_budget,
            max_entry_bytes=config.max_entry_bytes,
            ttl_seconds=config.ttl_seconds,
            counters=self.counters,
            on_change=None if journal is None else journal.publish,
        )
        self.mailbox = Mailbox(config.mailbox_size)
        self.flights: dict[FullKey, Flight] = {}
        self._flight_ids = itertools.count(1)
        # compute tasks and tier write-backs; close() cancels and awaits them
        self.tasks: set[asyncio.Task[None]] = set()
        # every caller's future until its get() returns: whatever state a crash leaves behind,
        # each of them is failed (a crash mid-handler may have detached them from their flight)
        self.waiting: set[asyncio.Future[Any]] = set()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.task: asyncio.Task[None] | None = None
        self.dead: CacheActorDead | None = None
        self.tier: TierIO | None = None
        if tier is not None:
            breaker = CircuitBreaker(config.tier_breaker_failures, config.tier_breaker_seconds)
            self.tier = TierIO(
                tier,
                timeout=config.tier_timeout,
                breaker=breaker,
                counters=self.counters,
                mailbox=self.mailbox,
                spawn=self.spawn,
                write_queue=config.tier_write_queue,
                writers=config.tier_writers,
            )
        self.watchdog = Watchdog(
            config,
            mailbox=self.mailbox,
            store=self.store,
            flights=self.flights,
            counters=self.counters,
        )
        self._handlers: dict[type, Callable[[Any], None]] = {
            Get: self._on_get,
            Done: self._on_done,
            WaiterLeft: self._on_waiter_left,
            DeadlinePassed: self._on_deadline_passed,
            Query: self._on_query,
            Tick: self.watchdog.on_tick,
        }
        if self.tier is not None:
            self._handlers[TierWriteFailed] = self.tier.on_write_failed

    def start(self) -> None:
        self.loop = loop = asyncio.get_running_loop()
        self.task = loop.create_task(self._run(), name="cache-actor")
        self.watchdog.start(loop)

    def spawn(
        self, coro: Coroutine[Any, Any, None], name: str, context: Context | None = None
    ) -> asyncio.Task[None]:
        """Start a task the actor owns: close() cancels and awaits it."""
        assert self.loop is not None
        task = self.loop.create_task(coro, name=name, context=context)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    # ── the loop ────────────────────────────────────────────────────────────────────────────

    async def _run(self) -> None:
        mailbox = self.mailbox
        handlers = self._handlers
        try:
            while True:
                await mailbox.wait()
                while (message := mailbox.take()) is not None:
                    if message is CLOSE:
                        raise _Closed
                    if type(message) is Fault:
                        await self._injected(message)
                        continue
                    handlers[type(message)](message)
        except _Closed:
            self._shut_down(CacheActorDead("cache actor is closed"))
        except BaseException as exc:
            log.critical("cache actor crashed; failing every waiter", exc_info=exc)
            self._shut_down(CacheActorDead(f"cache actor crashed: {exc!r}"))
            if not isinstance(exc, Exception):
                raise

    async def _injected(self, fault: Fault) -> None:
        """A fault on purpose: the loop crashes as a bug in a handler would, or stops taking
        messages for a while as a loop held up would (every lookup waits meanwhile)."""
        if fault.kind == "crash":
            raise InjectedCrash("the cache actor was killed on purpose (fault injection)")
        log.warning("cache actor stalled on purpose for %.1f s (fault injection)", fault.seconds)
        await asyncio.sleep(fault.seconds)

    def _shut_down(self, reason: CacheActorDead) -> None:
        """Fail everyone who waits or will ask, and cancel every computation."""
        self.dead = reason
        self.watchdog.stop()
        for flight in self.flights.values():
            if flight.deadline is not None:
                flight.deadline.cancel()
            flight.release_waiters()
        self.flights.clear()
        for future in self.waiting:
            _fail(future, reason)
        while (message := self.mailbox.take()) is not None:
            if isinstance(message, Query):
                _fail(message.future, reason)
        for task in self.tasks:
            task.cancel()

    # ── lookups ─────────────────────────────────────────────────────────────────────────────

    def _on_get(self, request: Get) -> None:
        future = request.future
        if future.done():  # its caller left before we got to it
            return
        full_key = request.full_key
        entry = self.store.get(full_key)
        if entry is not None:
            self.counters.hits += 1
            self.tenants(full_key[0]).hits += 1
            future.set_result(entry.hit)
            return
        chain = request.chain
        source = self._innermost_live(chain)
        flight = self.flights.get(full_key)
        if flight is not None:
            if flight in chain:
                self._reject_recursion(request, [*chain[chain.index(flight) :], flight])
                return
            if source is not None:
                cycle = flight.path_to(source)
                if cycle is not None:
                    self._reject_recursion(request, [source, *cycle])
                    return
            flight.add_waiter(future, self._park(request, source))
            self.counters.coalesced += 1
            self.tenants(full_key[0]).coalesced += 1
            return
        if len(self.flights) >= self.config.max_flights:
            self.counters.overloaded += 1
            future.set_exception(CacheOverloaded(f"{self.config.max_flights} flights in progress"))
            return
        self.counters.misses += 1
        self.tenants(full_key[0]).misses += 1
        self._start_flight(request, source)

    def _innermost_live(self, chain: tuple[Flight, ...]) -> Flight | None:
        """The innermost flight of this actor whose computation made the lookup."""
        for flight in reversed(chain):
            if self.flights.get(flight.full_key) is flight:
                return flight
        return None

    def _reject_recursion(self, request: Get, flights: list[Flight]) -> None:
        self.counters.recursion_rejections += 1
        cycle = tuple(f.full_key[1] for f in flights)
        message = "cache lookup would wait on itself: " + " -> ".join(cycle)
        log.error(message)
        request.future.set_exception(CacheRecursionError(message, cycle))

    def _park(self, request: Get, source: Flight | None) -> Waiter:
        """A caller that must wait for a flight: arm its deadline (a hit never needs one)."""
        assert self.loop is not None
        timer = self.loop.call_at(
            request.deadline, self._caller_deadline, request.full_key, request.future, request.wait
        )
        return Waiter(source, request.token, timer)

    def _caller_deadline(self, full_key: FullKey, future: asyncio.Future[Any], wait: float) -> None:
        if future.done():
            return
        future.set_exception(
            ComputeTimeout(f"no value for {full_key[1]!r} within the caller's {wait:g} s")
        )
        self.mailbox.post(WaiterLeft(full_key, future, timed_out=True))

    def _start_flight(self, request: Get, source: Flight | None) -> None:
        loop = self.loop
        assert loop is not None
        now = time.monotonic()
        flight = Flight(
            id=next(self._flight_ids),
            full_key=request.full_key,
            started_at=now,
            leader=request.future,
            leader_token=request.token,
            stage=request.tier_use.stage,
            label=request.label,
            cancel_when_orphaned=request.cancel_when_orphaned,
        )
        flight.add_waiter(request.future, self._park(request, source))
        self.flights[request.full_key] = flight
        # The computation runs in its caller's context (trace context included), with its
        # own flight appended to the lineage that recursion checks read.
        context = request.context
        context.run(COMPUTING.set, (*request.chain, flight))
        # an open breaker: neither read nor write until it closes again
        tier = self.tier if self.tier is not None and self.tier.allows(now) else None
        load = run_flight(
            flight,
            request.compute,
            weigher=self.config.weigher,
            mailbox=self.mailbox,
            tier=tier,
            use=request.tier_use,
        )
        flight.task = self.spawn(load, f"cache-flight-{flight.id}", context)
        flight.deadline = loop.call_later(
            self.config.compute_deadline, self.mailbox.post, DeadlinePassed(flight)
        )

    # ── flights ending ──────────────────────────────────────────────────────────────────────

    def _on_done(self, done: Done) -> None:
        flight = done.flight
        full_key = flight.full_key
        if done.tier_asked and self.tier is not None:
            self.tier.record_read(done)
        # identity check: a late completion of a flight that timed out or was cancelled must not
        # remove (or answer) the newer flight now holding the key
        if self.flights.get(full_key) is not flight:
            return
        del self.flights[full_key]
        if flight.deadline is not None:
            flight.deadline.cancel()
        waiters = flight.release_waiters()
        error = done.error
        if error is not None:
            self.counters.load_failures += 1
            self.tenants(full_key[0]).load_failures += 1
            if isinstance(error, asyncio.CancelledError):
                # a waiter that was not cancelled never receives CancelledError
                error = CacheError(f"computation of {full_key[1]!r} was cancelled")
            for future, _ in waiters:
                _fail(future, error)
            return
        self.counters.load_successes += 1
        self.counters.load_seconds += done.load_seconds
        if done.tier is not None:
            self.counters.tier_hits += 1
            self.tenants(full_key[0]).tier_hits += 1
        if flight.admit:
            hit = Lookup(done.value, Outcome.HIT, "memory", done.nbytes)
            self.store.admit(full_key, hit, done.nbytes, done.tier, flight.stage, flight.label)
        leader = flight.leader_token
        failure = None
        if done.tier_error is not None and self.tier is not None:
            kind = "timeout" if isinstance(done.tier_error, TimeoutError) else "error"
            failure = (self.tier.name, kind)
        miss = Lookup(done.value, Outcome.MISS, done.tier, done.nbytes, flight.id, leader, failure)
        joined = Lookup(
            done.value, Outcome.COALESCED, done.tier, done.nbytes, flight.id, leader, failure
        )
        for future, _ in waiters:
            if not future.done():
                future.set_result(miss if future is flight.leader else joined)

    def _on_waiter_left(self, left: WaiterLeft) -> None:
        if left.timed_out:
            self.counters.caller_timeouts += 1
        else:
            self.counters.cancelled_waiters += 1
        flight = self.flights.get(left.full_key)
        if flight is None or not flight.remove_waiter(left.future):
            return
        # an orphan keeps running by default (its key is likely asked for again), unless it is
        # still queued for capacity (nothing has been spent on it yet) or its lookup asked for it
        # to stop (it holds something, a connection, that nobody should hold for nobody)
        if not flight.waiters and (
            flight.queued or flight.cancel_when_orphaned or not self.config.finish_orphaned_flights
        ):
            self._end_flight(flight)

    def _on_deadline_passed(self, passed: DeadlinePassed) -> None:
        flight = passed.flight
        if self.flights.get(flight.full_key) is not flight:
            return
        self.counters.compute_timeouts += 1
        self.counters.load_failures += 1
        key = flight.full_key[1]
        error = ComputeTimeout(
            f"computation of {key!r} passed its {self.config.compute_deadline:g} s deadline"
        )
        waiters = self._end_flight(flight)
        log.warning("cancelled computation of %s after %.3g s", key, self.config.compute_deadline)
        for future, _ in waiters:
            _fail(future, error)

    def _end_flight(self, flight: Flight) -> list[tuple[asyncio.Future[Any], Waiter]]:
        """Remove a flight before it completes and cancel its computation."""
        del self.flights[flight.full_key]
        if flight.deadline is not None:
            flight.deadline.cancel()
        if flight.task is not None:
            flight.task.cancel()
        return flight.release_waiters()

    # ── queries ─────────────────────────────────────────────────────────────────────────────

    def _on_query(self, query: Query) -> None:
        if query.future.done():
            return
        try:
            result = query.run()
        except Exception as exc:  # noqa: BLE001 - the asker's to handle (a refused watch)
            query.future.set_exception(exc)
            return
        query.future.set_result(result)


def _fail(future: asyncio.Future[Any], error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)
