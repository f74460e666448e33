"""The cache actor: one asyncio task that owns every piece of cache state.

    caller task                       actor task (awaits nothing but its mailbox)
    ───────────                       ───────────────────────────────────────────
    get(key, compute)
      future = new Future()
      mailbox.offer(_Get) ─────────▶  _on_get: stored?  ── yes ─▶ future.set_result(HIT)
      await future (deadline)              │ in flight? ─ yes ─▶ join its waiters (COALESCED)
                                           │ no ────────────────▶ new Flight, spawn compute task
                                                                        │
    compute task (caller's context)                                     │
      second tier? → compute() → weigh                                  │
      mailbox.post(_Done) ─────────▶  _on_done: admit to store, resolve every waiter's future
      write back to the second tier (nobody waits for it)

Handlers are synchronous and touch only memory, so the actor cannot deadlock on itself: a
computation that asks for its own key is refused at once (CacheRecursionError) instead of waiting
on a lock it holds, which is the failure mmgate was built to make impossible.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import itertools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Generic, TypeVar, final

from .config import CacheConfig
from .errors import (
    CacheActorDead,
    CacheError,
    CacheOverloaded,
    CacheRecursionError,
    ComputeTimeout,
)
from .flights import COMPUTING, Flight, Waiter
from .lookup import Lookup, LookupEvent, LookupHook, Outcome
from .mailbox import Mailbox
from .stacks import await_stack
from .stats import CacheStats, Counters, EntryInfo
from .store import FullKey, Store
from .tiers import CircuitBreaker, SecondTier

V = TypeVar("V")
T = TypeVar("T")

log = logging.getLogger("cache_actor")

# How long close() waits for cancelled computations to finish before it reports them.
_CLOSE_GRACE_SECONDS = 5.0


# ── messages ────────────────────────────────────────────────────────────────────────────────


@final
@dataclass(slots=True)
class _Get:
    full_key: FullKey
    compute: Callable[[], Awaitable[Any]]
    future: asyncio.Future[Any]
    context: contextvars.Context
    chain: tuple[Flight, ...]
    token: object | None
    # the caller's deadline on the loop's clock, armed by the actor when the caller must wait
    deadline: float
    wait: float


@final
@dataclass(slots=True)
class _Done:
    flight: Flight
    value: Any
    nbytes: int
    tier: str | None
    error: BaseException | None
    tier_error: BaseException | None
    tier_asked: bool
    load_seconds: float


@final
@dataclass(slots=True)
class _WaiterLeft:
    full_key: FullKey
    future: asyncio.Future[Any]
    timed_out: bool


@final
@dataclass(slots=True)
class _DeadlinePassed:
    flight: Flight


@final
@dataclass(slots=True)
class _TierWriteFailed:
    error: BaseException


@final
@dataclass(slots=True)
class _Query:
    """invalidate, inspect and ping: a synchronous function of the actor's state."""

    run: Callable[[], Any]
    future: asyncio.Future[Any]


@final
@dataclass(slots=True)
class _Tick:
    lag: float


_CLOSE = object()


class _Closed(Exception):
    """Raised inside the actor's loop to end it on close()."""


# ── the actor ───────────────────────────────────────────────────────────────────────────────


@final
class CacheActor(Generic[V]):
    """A cache that coalesces identical work and cannot deadlock on itself.

    Use it as ``async with CacheActor(CacheConfig(...)) as cache: await cache.get(key, compute)``.
    """

    def __init__(
        self,
        config: CacheConfig | None = None,
        *,
        tier: SecondTier | None = None,
        hook: LookupHook | None = None,
    ) -> None:
        self.config = config or CacheConfig()
        self._tier = tier
        self._hook = hook
        self._counters = Counters()
        self._store = Store(
            max_bytes=self.config.max_bytes,
            tenant_budget=self.config.tenant_budget,
            max_entry_bytes=self.config.max_entry_bytes,
            ttl_seconds=self.config.ttl_seconds,
            counters=self._counters,
        )
        self._breaker = CircuitBreaker(
            self.config.tier_breaker_failures, self.config.tier_breaker_seconds
        )
        self._mailbox = Mailbox(self.config.mailbox_size)
        self._flights: dict[FullKey, Flight] = {}
        self._flight_ids = itertools.count(1)
        # compute tasks and tier write-backs; close() cancels and awaits them
        self._tasks: set[asyncio.Task[None]] = set()
        # every caller's future until its get() returns: whatever state a crash leaves behind,
        # each of them is failed (a crash mid-handler may have detached them from their flight)
        self._waiting: set[asyncio.Future[Any]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._tick: asyncio.TimerHandle | None = None
        self._dead: CacheActorDead | None = None
        self._loop_lag = 0.0
        self._handlers: dict[type, Callable[[Any], None]] = {
            _Get: self._on_get,
            _Done: self._on_done,
            _WaiterLeft: self._on_waiter_left,
            _DeadlinePassed: self._on_deadline_passed,
            _TierWriteFailed: self._on_tier_write_failed,
            _Query: self._on_query,
            _Tick: self._on_tick,
        }

    # ── lifecycle ───────────────────────────────────────────────────────────────────────────

    async def __aenter__(self) -> CacheActor[V]:
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
        if self._task is not None:
            raise RuntimeError("CacheActor already started")
        self._loop = asyncio.get_running_loop()
        self._task = self._loop.create_task(self._run(), name="cache-actor")
        self._schedule_tick()

    @property
    def alive(self) -> bool:
        """True while the actor serves lookups: started, not closed, not crashed."""
        return self._task is not None and self._dead is None

    async def aclose(self) -> None:
        """Stop serving: every pending and later caller gets CacheActorDead; no task is left."""
        if self._task is None:
            self._dead = self._dead or CacheActorDead("cache actor was never started")
            return
        if not self._task.done():
            self._mailbox.post(_CLOSE)
            # the loop ends at the next message; a handler never awaits, so this is quick
            await asyncio.wait({self._task}, timeout=_CLOSE_GRACE_SECONDS)
            if not self._task.done():  # pragma: no cover - would mean a handler blocked the loop
                self._task.cancel()
                await asyncio.wait({self._task}, timeout=_CLOSE_GRACE_SECONDS)
        if self._tasks:
            _, pending = await asyncio.wait(set(self._tasks), timeout=_CLOSE_GRACE_SECONDS)
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
    ) -> Lookup[V]:
        """The value for ``key``, computing it with ``compute`` at most once at a time.

        ``timeout`` bounds this caller's wait (``CacheConfig.default_timeout`` when None); on
        expiry ComputeTimeout is raised and the flight goes on for the others. A computation's
        exception is raised here with its own type, and nothing is stored.
        """
        dead = self._dead
        if dead is not None or self._loop is None:
            raise dead or CacheActorDead("cache actor is not started")
        loop = self._loop
        hook = self._hook
        token: object | None = None
        started = 0.0
        if hook is not None:
            started = time.perf_counter()
            token = _call_hook(hook.lookup_started, tenant, key)
        full_key = (tenant, key)
        future: asyncio.Future[Lookup[V]] = loop.create_future()
        wait = self.config.default_timeout if timeout is None else timeout
        request = _Get(
            full_key,
            compute,
            future,
            contextvars.copy_context(),
            COMPUTING.get(),
            token,
            loop.time() + wait,
            wait,
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
                self._mailbox.post(_WaiterLeft(full_key, future, timed_out=False))
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
        c = self._counters
        now = time.monotonic()
        oldest = min((f.started_at for f in self._flights.values()), default=now)
        counts = dataclasses.asdict(c)
        # refused offers are counted by the mailbox itself, the callers never reached the actor
        counts["overloaded"] += self._mailbox.rejected
        return CacheStats(
            **counts,
            entries=len(self._store),
            bytes=self._store.bytes,
            bytes_by_tenant=self._store.bytes_by_tenant(),
            flights=len(self._flights),
            waiters=sum(len(f.waiters) for f in self._flights.values()),
            mailbox_depth=len(self._mailbox),
            loop_lag_seconds=self._loop_lag,
            oldest_flight_seconds=now - oldest,
            tier_breaker_open=self._tier is not None and self._breaker.is_open(now),
            alive=self.alive,
        )

    async def invalidate(self, key: str, *, tenant: str = "default", timeout: float = 5.0) -> bool:
        """Forget a key in memory and in the second tier; True if memory held it.

        A flight in progress for the key still answers its waiters but stores nothing.
        """
        full_key = (tenant, key)

        def forget() -> bool:
            flight = self._flights.get(full_key)
            if flight is not None:
                flight.admit = False
            return self._store.remove(full_key)

        removed: bool = await self._ask(forget, timeout)
        if self._tier is not None:
            try:
                async with asyncio.timeout(self.config.tier_timeout):
                    await self._tier.delete(tenant, key, timeout=self.config.tier_timeout)
            except Exception:
                log.warning(
                    "second tier %s: delete of %s failed", self._tier.name, key, exc_info=True
                )
        return removed

    async def inspect(
        self, key: str, *, tenant: str = "default", timeout: float = 5.0
    ) -> EntryInfo:
        """What memory holds for a key: a stored value, a flight, or nothing."""
        full_key = (tenant, key)

        def look() -> EntryInfo:
            now = time.monotonic()
            entry = self._store.peek(full_key)
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
            flight = self._flights.get(full_key)
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

    # ── caller-side helpers ─────────────────────────────────────────────────────────────────

    async def _ask(self, run: Callable[[], T], timeout: float) -> T:
        dead = self._dead
        if dead is not None or self._loop is None:
            raise dead or CacheActorDead("cache actor is not started")
        future: asyncio.Future[T] = self._loop.create_future()
        self._mailbox.post(_Query(run, future))
        async with asyncio.timeout(timeout):
            return await future

    def _caller_deadline(self, full_key: FullKey, future: asyncio.Future[Any], wait: float) -> None:
        if future.done():
            return
        future.set_exception(
            ComputeTimeout(f"no value for {full_key[1]!r} within the caller's {wait:g} s")
        )
        self._mailbox.post(_WaiterLeft(full_key, future, timed_out=True))

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
            leader_token=None if lookup is None else lookup.leader_token,
        )
        _call_hook(hook.lookup_finished, token, event)

    # ── the actor's loop ────────────────────────────────────────────────────────────────────

    async def _run(self) -> None:
        mailbox = self._mailbox
        handlers = self._handlers
        try:
            while True:
                await mailbox.wait()
                while (message := mailbox.take()) is not None:
                    if message is _CLOSE:
                        raise _Closed
                    handlers[type(message)](message)
        except _Closed:
            self._shut_down(CacheActorDead("cache actor is closed"))
        except BaseException as exc:
            log.critical("cache actor crashed; failing every waiter", exc_info=exc)
            self._shut_down(CacheActorDead(f"cache actor crashed: {exc!r}"))
            if not isinstance(exc, Exception):
                raise

    def _shut_down(self, reason: CacheActorDead) -> None:
        """Fail everyone who waits or will ask, and cancel every computation."""
        self._dead = reason
        if self._tick is not None:
            self._tick.cancel()
        for flight in self._flights.values():
            if flight.deadline is not None:
                flight.deadline.cancel()
            flight.release_waiters()
        self._flights.clear()
        for future in self._waiting:
            _fail(future, reason)
        while (message := self._mailbox.take()) is not None:
            if isinstance(message, _Query):
                _fail(message.future, reason)
        for task in self._tasks:
            task.cancel()

    def _on_get(self, request: _Get) -> None:
        future = request.future
        if future.done():  # its caller left before we got to it
            return
        full_key = request.full_key
        entry = self._store.get(full_key)
        if entry is not None:
            self._counters.hits += 1
            future.set_result(entry.hit)
            return
        chain = request.chain
        source = self._innermost_live(chain)
        flight = self._flights.get(full_key)
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
            self._counters.coalesced += 1
            return
        if len(self._flights) >= self.config.max_flights:
            self._counters.overloaded += 1
            future.set_exception(CacheOverloaded(f"{self.config.max_flights} flights in progress"))
            return
        self._counters.misses += 1
        self._start_flight(request, source)

    def _park(self, request: _Get, source: Flight | None) -> Waiter:
        """A caller that must wait for a flight: arm its deadline (a hit never needs one)."""
        assert self._loop is not None
        timer = self._loop.call_at(
            request.deadline, self._caller_deadline, request.full_key, request.future, request.wait
        )
        return Waiter(source, request.token, timer)

    def _start_flight(self, request: _Get, source: Flight | None) -> None:
        loop = self._loop
        assert loop is not None
        now = time.monotonic()
        flight = Flight(
            id=next(self._flight_ids),
            full_key=request.full_key,
            started_at=now,
            leader=request.future,
            leader_token=request.token,
        )
        flight.add_waiter(request.future, self._park(request, source))
        self._flights[request.full_key] = flight
        # The computation runs in its caller's context (trace context included), with its
        # own flight appended to the lineage that recursion checks read.
        context = request.context
        context.run(COMPUTING.set, (*request.chain, flight))
        ask_tier = self._tier is not None and self._breaker.allows(now)
        task = loop.create_task(
            self._compute(flight, request.compute, ask_tier),
            name=f"cache-flight-{flight.id}",
            context=context,
        )
        flight.task = task
        self._track(task)
        flight.deadline = loop.call_later(
            self.config.compute_deadline, self._mailbox.post, _DeadlinePassed(flight)
        )

    def _on_done(self, done: _Done) -> None:
        flight = done.flight
        full_key = flight.full_key
        self._record_tier_read(done)
        # identity check: a late completion of a flight that timed out or was cancelled must not
        # remove (or answer) the newer flight now holding the key
        if self._flights.get(full_key) is not flight:
            return
        del self._flights[full_key]
        if flight.deadline is not None:
            flight.deadline.cancel()
        waiters = flight.release_waiters()
        error = done.error
        if error is not None:
            self._counters.load_failures += 1
            if isinstance(error, asyncio.CancelledError):
                # a waiter that was not cancelled never receives CancelledError
                error = CacheError(f"computation of {full_key[1]!r} was cancelled")
            for future, _ in waiters:
                _fail(future, error)
            return
        self._counters.load_successes += 1
        self._counters.load_seconds += done.load_seconds
        if done.tier is not None:
            self._counters.tier_hits += 1
        if flight.admit:
            hit = Lookup(done.value, Outcome.HIT, "memory", done.nbytes)
            self._store.admit(full_key, hit, done.value, done.nbytes, done.tier)
        leader = flight.leader_token
        miss = Lookup(done.value, Outcome.MISS, done.tier, done.nbytes, flight.id, leader)
        joined = Lookup(done.value, Outcome.COALESCED, done.tier, done.nbytes, flight.id, leader)
        for future, _ in waiters:
            if not future.done():
                future.set_result(miss if future is flight.leader else joined)

    def _record_tier_read(self, done: _Done) -> None:
        if not done.tier_asked:
            return
        if done.tier_error is not None:
            self._counters.tier_errors += 1
            self._breaker.record_failure(time.monotonic())
            log.warning(
                "second tier read failed for %s: %r", done.flight.full_key[1], done.tier_error
            )
        else:
            self._breaker.record_success()

    def _on_waiter_left(self, left: _WaiterLeft) -> None:
        if left.timed_out:
            self._counters.caller_timeouts += 1
        else:
            self._counters.cancelled_waiters += 1
        flight = self._flights.get(left.full_key)
        if flight is None or not flight.remove_waiter(left.future):
            return
        if not flight.waiters and not self.config.finish_orphaned_flights:
            self._end_flight(flight)

    def _on_deadline_passed(self, passed: _DeadlinePassed) -> None:
        flight = passed.flight
        if self._flights.get(flight.full_key) is not flight:
            return
        self._counters.compute_timeouts += 1
        self._counters.load_failures += 1
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
        del self._flights[flight.full_key]
        if flight.deadline is not None:
            flight.deadline.cancel()
        if flight.task is not None:
            flight.task.cancel()
        return flight.release_waiters()

    def _on_tier_write_failed(self, failed: _TierWriteFailed) -> None:
        self._counters.tier_write_errors += 1
        self._breaker.record_failure(time.monotonic())
        log.warning("second tier write failed: %r", failed.error)

    def _on_query(self, query: _Query) -> None:
        if not query.future.done():
            query.future.set_result(query.run())

    def _on_tick(self, tick: _Tick) -> None:
        self._loop_lag = tick.lag
        if tick.lag >= self.config.loop_lag_warning:
            # something blocked the event loop: every lookup and every RPC waited that long
            log.warning("event loop lagged %.3f s behind the cache watchdog", tick.lag)
        now = time.monotonic()
        self._store.expire()
        threshold = self.config.stall_threshold
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

    # ── helpers of the actor ────────────────────────────────────────────────────────────────

    def _innermost_live(self, chain: tuple[Flight, ...]) -> Flight | None:
        """The innermost flight of this actor whose computation made the lookup."""
        for flight in reversed(chain):
            if self._flights.get(flight.full_key) is flight:
                return flight
        return None

    def _reject_recursion(self, request: _Get, flights: list[Flight]) -> None:
        self._counters.recursion_rejections += 1
        cycle = tuple(f.full_key[1] for f in flights)
        message = "cache lookup would wait on itself: " + " -> ".join(cycle)
        log.error(message)
        request.future.set_exception(CacheRecursionError(message, cycle))

    def _schedule_tick(self) -> None:
        loop = self._loop
        assert loop is not None
        due = loop.time() + self.config.watchdog_interval
        self._tick = loop.call_at(due, self._post_tick, due)

    def _post_tick(self, due: float) -> None:
        assert self._loop is not None
        # how late the timer fired: the event loop's lag, which also delays every message
        self._mailbox.post(_Tick(max(0.0, self._loop.time() - due)))
        if self._dead is None:
            self._schedule_tick()

    def _track(self, task: asyncio.Task[None]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _compute(
        self, flight: Flight, compute: Callable[[], Awaitable[Any]], ask_tier: bool
    ) -> None:
        """Runs in a task of its own: load one value and post the outcome to the mailbox."""
        tenant, key = flight.full_key
        started = time.perf_counter()
        value: Any = None
        nbytes = 0
        tier_name: str | None = None
        tier_error: BaseException | None = None
        error: BaseException | None = None
        try:
            if ask_tier:
                value, tier_error = await self._read_tier(tenant, key)
                if value is not None:
                    tier_name = self._tier.name if self._tier is not None else None
            if value is None:
                value = await compute()
            nbytes = self.config.weigher(value)
        except BaseException as exc:  # noqa: BLE001 - every outcome must reach the mailbox
            error = exc
        # always post, whatever happened: a flight without a completion strands its waiters
        self._mailbox.post(
            _Done(
                flight,
                value,
                nbytes,
                tier_name,
                error,
                tier_error,
                ask_tier,
                time.perf_counter() - started,
            )
        )
        if error is not None:
            if not isinstance(error, Exception):
                raise error
            return
        if ask_tier and tier_name is None and tier_error is None:
            self._write_back(tenant, key, value)

    async def _read_tier(self, tenant: str, key: str) -> tuple[Any, BaseException | None]:
        tier = self._tier
        assert tier is not None
        timeout = self.config.tier_timeout
        try:
            async with asyncio.timeout(timeout):
                return await tier.get(tenant, key, timeout=timeout), None
        except Exception as exc:  # noqa: BLE001 - a tier error is a miss, reported, never raised
            return None, exc

    def _write_back(self, tenant: str, key: str, value: Any) -> None:
        """Store a computed value in the second tier without delaying anyone."""
        tier = self._tier
        assert tier is not None
        assert self._loop is not None
        timeout = self.config.tier_timeout

        async def write() -> None:
            try:
                async with asyncio.timeout(timeout):
                    await tier.set(tenant, key, value, timeout=timeout)
            except Exception as exc:  # noqa: BLE001 - reported to the breaker, never raised
                self._mailbox.post(_TierWriteFailed(exc))

        self._track(self._loop.create_task(write(), name=f"cache-write-back-{key[:16]}"))


def _fail(future: asyncio.Future[Any], error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)


def _call_hook(method: Callable[..., T], *args: Any) -> T | None:
    try:
        return method(*args)
    except Exception:
        log.exception("cache lookup hook %r failed", method)
        return None
