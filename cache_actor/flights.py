"""Work in progress: one ``Flight`` per key being loaded, and the wait-for graph between flights.

A flight is pinned: it lives outside the store, weighs nothing, and cannot be evicted; its value
is admitted with its real size only once it completes. Each waiter holds its own future.

Recursion is caught from two sides:

- ``COMPUTING`` is a ContextVar holding the flights whose computation the current task belongs to
  (compute tasks inherit their caller's context, and tasks they spawn inherit theirs), so a lookup
  of a key whose flight is in that chain would wait on itself: rejected at once.
- A lookup made from inside a computation adds an edge "this flight waits on that flight"; joining
  a flight that (transitively) waits on the joiner's own flight would close a cycle across two
  request lineages: rejected at once, the cycle named.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import final

from .stages import Stage
from .store import FullKey

COMPUTING: ContextVar[tuple[Flight, ...]] = ContextVar("cache_actor_computing", default=())


@contextlib.contextmanager
def waiting_to_start() -> Iterator[None]:
    """Wrap a computation's wait for capacity (a worker thread, a slot) in this: should every
    waiter leave meanwhile, the computation is cancelled before it starts instead of finishing
    for nobody. Outside a computation it does nothing."""
    chain = COMPUTING.get()
    if not chain:
        yield
        return
    flight = chain[-1]
    flight.queued = True
    try:
        yield
    finally:
        flight.queued = False


@final
@dataclass(slots=True, eq=False)
class Waiter:
    # the flight whose computation made this lookup, if any: the source of a wait-for edge
    from_flight: Flight | None
    token: object | None
    # fires the caller's own deadline; cancelled once the waiter is answered or leaves
    timer: asyncio.TimerHandle


@final
@dataclass(slots=True, eq=False)
class Flight:
    id: int
    full_key: FullKey
    started_at: float
    leader: asyncio.Future[object]
    leader_token: object | None
    waiters: dict[asyncio.Future[object], Waiter] = field(default_factory=dict)
    # wait-for edges: flights this flight's computation is waiting on, with how many lookups
    blocked_on: dict[Flight, int] = field(default_factory=dict)
    task: asyncio.Task[None] | None = None
    deadline: asyncio.TimerHandle | None = None
    # False once the key is invalidated while loading: the value is delivered but not stored
    admit: bool = True
    stall_reported: bool = False
    stage: Stage = Stage.ANY  # what its entry tells watchers (events.py)
    label: str = ""
    # set by the computation itself (waiting_to_start): nothing has been spent on it yet, so
    # it is cancelled when its last waiter leaves, whatever finish_orphaned_flights says. The
    # one field a computation writes; it runs on the actor's event loop, so the actor reads it
    # between two of its own handlers.
    queued: bool = False
    # set by the lookup that started it: cancelled when its last waiter leaves, whatever
    # finish_orphaned_flights says (a computation worth nothing to a caller who comes later)
    cancel_when_orphaned: bool = False

    def add_waiter(self, future: asyncio.Future[object], waiter: Waiter) -> None:
        self.waiters[future] = waiter
        source = waiter.from_flight
        if source is not None:
            source.blocked_on[self] = source.blocked_on.get(self, 0) + 1

    def remove_waiter(self, future: asyncio.Future[object]) -> bool:
        waiter = self.waiters.pop(future, None)
        if waiter is None:
            return False
        self._detach(waiter)
        return True

    def release_waiters(self) -> list[tuple[asyncio.Future[object], Waiter]]:
        """Take every waiter out, with its deadline and its wait-for edge."""
        waiters = list(self.waiters.items())
        self.waiters.clear()
        for _, waiter in waiters:
            self._detach(waiter)
        return waiters

    def path_to(self, target: Flight) -> list[Flight] | None:
        """Flights from this one to ``target`` along wait-for edges, both ends included."""
        stack: list[tuple[Flight, list[Flight]]] = [(self, [self])]
        seen = {id(self)}
        while stack:
            flight, path = stack.pop()
            if flight is target:
                return path
            for nxt in flight.blocked_on:
                if id(nxt) not in seen:
                    seen.add(id(nxt))
                    stack.append((nxt, [*path, nxt]))
        return None

    def _detach(self, waiter: Waiter) -> None:
        waiter.timer.cancel()
        source = waiter.from_flight
        if source is None:
            return
        count = source.blocked_on.get(self, 0) - 1
        if count > 0:
            source.blocked_on[self] = count
        else:
            source.blocked_on.pop(self, None)
