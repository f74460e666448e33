"""What the store did, as a stream: admits, evictions, expiries and invalidations, numbered.

    store (actor loop) ─ publish(change, key, entry) ─▶ Journal: the tenant's next number, and the
                                                        next among every tenant's events
                                                          ├─▶ history (the last N events: resume)
                                                          └─▶ each Watcher whose WatchFilter
                                                              admits it (tenants, stage): a
                                                              bounded buffer, then one GAP

Each tenant's events are numbered on their own, 1, 2, 3 ...: a tenant's watcher sees nothing of
another tenant's activity, not even in the gaps between its numbers. A watcher of several tenants
or of all of them (an admin's) counts every tenant's events together instead (``position``), so
its numbers, too, have no gaps and resume from one ``since``. A watcher of one stage keeps its
count's numbers: the other stages' events are the holes between them.

A watcher is owed first the events after its ``since`` (or a snapshot: HELD events), then one
SYNCED, then live events. Publishing never waits and never grows without bound: a watcher that
does not read fills its buffer, gets a single GAP event after what it holds and nothing more
(its stream ends there; its client resumes from the last sequence number it saw, or starts over
with a snapshot). The history is shared by every tenant, bounded in events: a resume is answered
from it while it still holds every event of the watcher's count after ``since``. The journal
outlives any one actor: when an actor dies, every watcher gets a gap and the history is cleared,
since what it told of is gone with the actor.

The journal alone writes its state and counts what it did (``figures()``); a watcher is the
subscriber's end of it: its buffer, read with ``next()``.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import enum
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final, final

from .errors import CacheOverloaded
from .stages import Stage
from .store import Change, Entry, FullKey

# the count of every tenant's events together (an admin's), where a tenant's name keys its own
EVERY_TENANT: Final = None


class EventKind(enum.StrEnum):
    """What a watcher is told: a change to what the store holds, or where its stream stands."""

    HELD = "held"  # an entry of a snapshot
    SYNCED = "synced"  # what it was owed (a snapshot, or the events missed) is over: live follows
    ADMIT = "admit"
    EVICT = "evict"  # budget pressure
    EXPIRE = "expire"  # TTL
    INVALIDATE = "invalidate"
    GAP = "gap"  # it fell behind, or the store is gone: nothing follows


@final
@dataclass(frozen=True, slots=True)
class CacheEvent:
    """One change to what the store holds (``HELD``: an entry of a snapshot), or a watcher's
    ``SYNCED`` or ``GAP`` (no tenant, key or stage).

    ``sequence`` is the number a watcher resumes from: as published, its tenant's own count; as
    a watcher of several tenants hands it out, the same as ``position``, the count of every
    tenant's events together. ``snapshot``: an entry of a snapshot, or the SYNCED that ends one
    (what is held is exactly the HELD events before it)."""

    sequence: int
    kind: EventKind
    tenant: str
    key: str
    stage: Stage  # the stage the lookup named (Stage.ANY when none)
    label: str  # what the lookup said the value is about (an image's digest), or ""
    nbytes: int
    tier: str | None  # where the value came from when admitted (None: computed here)
    position: int = 0
    snapshot: bool = False


def _marker(kind: EventKind, number: int, snapshot: bool = False) -> CacheEvent:
    """A SYNCED or a GAP: where a watcher's stream stands, after ``number``."""
    return CacheEvent(number, kind, "", "", Stage.ANY, "", 0, None, number, snapshot)


@final
@dataclass(frozen=True, slots=True)
class WatchFilter:
    """What a watcher is told of: the events of ``tenants`` (None: every tenant's) in
    ``stage`` (Stage.ANY: every stage)."""

    tenants: frozenset[str] | None
    stage: Stage = Stage.ANY

    @property
    def scope(self) -> str | None:
        """The count its numbers are in: its one tenant's, else every tenant's together."""
        if self.tenants is not None and len(self.tenants) == 1:
            return next(iter(self.tenants))
        return EVERY_TENANT

    def admits(self, tenant: str, stage: Stage) -> bool:
        return (self.tenants is None or tenant in self.tenants) and (
            self.stage is Stage.ANY or stage == self.stage
        )


@final
@dataclass(frozen=True, slots=True)
class WatchStats:
    """The journal's figures: watchers subscribed, events handed to them (a gap included) and
    gaps (watchers that fell behind, were abandoned or were reset)."""

    watchers: int = 0
    events: int = 0
    gaps: int = 0


@final
class Watcher:
    """One subscriber's end of the journal: the events its filter admits, buffered up to
    ``capacity`` by the journal, taken with ``next()``.

    A watcher of one tenant counts that tenant's events (``scope``: its name); any other counts
    every tenant's together (``scope`` None), and its events carry that count as ``sequence``."""

    def __init__(self, journal: Journal, watching: WatchFilter, capacity: int) -> None:
        self._journal = journal
        self.filter = watching
        self.scope = watching.scope
        self.capacity = capacity
        self._buffer: collections.deque[CacheEvent] = collections.deque()
        self._ready = asyncio.Event()
        self.gapped = False  # its gap is buffered (or it was abandoned): nothing more comes
        self.ended = False  # its gap has been taken: ``next()`` has nothing more to give
        self.sent = 0
        self.since = 0  # the sequence number its first events bring it to
        self.resumed = False  # its first events: those missed (True) or a snapshot

    @property
    def synced(self) -> CacheEvent:
        """What it is told after its first events: live events follow, numbered after
        ``since``."""
        return _marker(EventKind.SYNCED, self.since, snapshot=not self.resumed)

    def number(self, event: CacheEvent) -> int:
        """``event``'s number in this watcher's count."""
        return event.sequence if self.scope is not EVERY_TENANT else event.position

    def numbered(self, event: CacheEvent) -> CacheEvent:
        """``event`` as this watcher hands it out: ``sequence`` in its own count."""
        if self.scope is not EVERY_TENANT or event.sequence == event.position:
            return event
        return dataclasses.replace(event, sequence=event.position)

    async def next(self) -> list[CacheEvent]:
        """The events buffered since the last call (waits for one); after a gap, the gap last
        (and ``ended``)."""
        await self._ready.wait()
        events = list(self._buffer)
        self._buffer.clear()
        self._ready.clear()
        self.sent += len(events)
        if events and events[-1].kind is EventKind.GAP:
            self.ended = True
        return events

    def abandon(self) -> None:
        """Its reader stopped taking events (the service's idle limit): see Journal.abandon."""
        self._journal.abandon(self)

    def close(self) -> None:
        self._journal.unsubscribe(self)

    # ── the journal's side ──────────────────────────────────────────────────────────────────

    @property
    def _full(self) -> bool:
        return len(self._buffer) >= self.capacity

    def _put(self, event: CacheEvent) -> None:
        self._buffer.append(event)
        self._ready.set()

    def _stop(self) -> None:
        """Nothing more for it, and nothing of what it holds: it was abandoned."""
        self.gapped = True
        self._buffer.clear()


@final
class Journal:
    """Sequence numbers, the recent history, the watchers and their figures; touched by the
    actor's loop."""

    # the library's defaults, which the service's settings read (one source for each)
    DEFAULT_HISTORY: Final = 4096
    DEFAULT_MAX_WATCHERS: Final = 16

    def __init__(
        self, history: int = DEFAULT_HISTORY, max_watchers: int = DEFAULT_MAX_WATCHERS
    ) -> None:
        self.history: collections.deque[CacheEvent] = collections.deque()
        self.history_size = history
        self.max_watchers = max_watchers
        self.watchers: set[Watcher] = set()
        self.sequence = 0  # the last number given among every tenant's events (``position``)
        self._counts: dict[str, int] = {}  # each tenant's last number
        # per count: the last number whose event the history no longer holds (or that told of
        # a store now gone): a resume from before it is answered with a snapshot
        self._forgotten: dict[str | None, int] = {}
        self.sent = 0  # events handed to watchers' buffers, their gaps included
        self.gaps = 0  # watchers given a gap, or abandoned before one

    def figures(self) -> WatchStats:
        return WatchStats(len(self.watchers), self.sent, self.gaps)

    def last(self, scope: str | None) -> int:
        """The last number given in a count: a tenant's, or every tenant's (None)."""
        return self.sequence if scope is EVERY_TENANT else self._counts.get(scope, 0)

    def publish(self, change: Change, full_key: FullKey, entry: Entry) -> None:
        tenant, key = full_key
        self.sequence += 1
        number = self._counts[tenant] = self._counts.get(tenant, 0) + 1
        event = CacheEvent(
            number,
            EventKind(change),
            tenant,
            key,
            entry.stage,
            entry.label,
            entry.nbytes,
            entry.tier,
            self.sequence,
        )
        if len(self.history) >= self.history_size:
            dropped = self.history.popleft()
            self._forgotten[dropped.tenant] = dropped.sequence
            self._forgotten[EVERY_TENANT] = dropped.position
        self.history.append(event)
        for watcher in self.watchers:
            if watcher.filter.admits(tenant, entry.stage):
                self._hand(watcher, event)

    def _hand(self, watcher: Watcher, event: CacheEvent) -> None:
        if watcher.gapped:
            return
        if watcher._full:
            # behind: one gap after what it holds (the number before this one), and nothing more
            self._gap(watcher, watcher.number(event) - 1)
            return
        watcher._put(watcher.numbered(event))
        self.sent += 1

    def _gap(self, watcher: Watcher, after: int) -> None:
        if not watcher.gapped:
            watcher.gapped = True
            watcher._put(_marker(EventKind.GAP, after))
            self.sent += 1
            self.gaps += 1

    def reset(self) -> None:
        """The store these events told of is gone: every watcher starts over."""
        for watcher in self.watchers:
            self._gap(watcher, self.last(watcher.scope))
        self.history.clear()
        # each count takes one more number, and no resume from before it is answered from the
        # history (it would miss that the entries are gone)
        self.sequence += 1
        self._counts = {tenant: number + 1 for tenant, number in self._counts.items()}
        self._forgotten = dict(self._counts.items())
        self._forgotten[EVERY_TENANT] = self.sequence

    def subscribe(
        self,
        watching: WatchFilter,
        since: int,
        capacity: int,
        held: Callable[[], Iterable[tuple[FullKey, Entry]]],
    ) -> tuple[Watcher, list[CacheEvent]]:
        """A new watcher of what ``watching`` admits, and what it is owed first: the events
        after ``since`` (in its count) when the history still has them all, else a snapshot of
        what is held (``held`` entries, numbered with the count's last number); its ``synced``
        follows them. Called between two of the actor's messages, so nothing is missed or told
        twice between the two."""
        if len(self.watchers) >= self.max_watchers:
            raise CacheOverloaded(f"{self.max_watchers} cache watchers already")
        watcher = Watcher(self, watching, capacity)
        last = self.last(watcher.scope)
        if 0 < since <= last and self._forgotten.get(watcher.scope, 0) <= since:
            watcher.resumed = True
            first = [
                watcher.numbered(e)
                for e in self.history
                if watching.admits(e.tenant, e.stage) and watcher.number(e) > since
            ]
        else:
            first = [
                CacheEvent(
                    last, EventKind.HELD, t, k, e.stage, e.label, e.nbytes, e.tier, last, True
                )
                for (t, k), e in held()
                if watching.admits(t, e.stage)
            ]
        watcher.since = last
        self.watchers.add(watcher)
        return watcher, first

    def unsubscribe(self, watcher: Watcher) -> None:
        """``watcher`` is told nothing more (again: nothing)."""
        self.watchers.discard(watcher)

    def abandon(self, watcher: Watcher) -> None:
        """``watcher``'s reader stopped taking events (the service's idle limit): it fell behind
        as a full buffer does, counted as one gap unless it already had one, and is closed."""
        if not watcher.gapped:
            self.gaps += 1
        watcher._stop()
        self.unsubscribe(watcher)


__all__ = ["CacheEvent", "EventKind", "Journal", "WatchFilter", "WatchStats", "Watcher"]
