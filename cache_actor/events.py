"""What the store did, as a stream: admits, evictions, expiries and invalidations, numbered.

    store (actor loop) ─ publish(kind, key, entry) ─▶ Journal: the tenant's next number, and the
                                                      next among every tenant's events
                                                        ├─▶ history (the last N events: resume)
                                                        └─▶ each Watcher whose tenants match:
                                                            a bounded buffer, then one "gap"

Each tenant's events are numbered on their own, 1, 2, 3 ...: a tenant's watcher sees nothing of
another tenant's activity, not even in the gaps between its numbers. A watcher of several tenants
or of all of them (an admin's) counts every tenant's events together instead (``position``), so
its numbers, too, have no gaps and resume from one ``since``.

Publishing never waits and never grows without bound: a watcher that does not read fills its
buffer, gets a single "gap" event after what it holds and nothing more (its stream ends there;
its client resumes from the last sequence number it saw, or starts over with a snapshot). The
history is shared by every tenant, bounded in events: a resume is answered from it while it still
holds every event of the watcher's count after ``since``. The journal outlives any one actor:
when an actor dies, every watcher gets a gap and the history is cleared, since what it told of is
gone with the actor.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final, Literal, final

from .errors import CacheOverloaded
from .stages import Stage
from .store import Entry, FullKey

Kind = Literal["held", "admit", "evict", "expire", "invalidate", "gap"]
GAP: Final = "gap"
# the count of every tenant's events together (an admin's), where a tenant's name keys its own
EVERY_TENANT: Final = None


@final
@dataclass(frozen=True, slots=True)
class CacheEvent:
    """One change to what the store holds (``held``: an entry of a snapshot).

    ``sequence`` is the number a watcher resumes from: as published, its tenant's own count; as
    a watcher of several tenants hands it out, the same as ``position``, the count of every
    tenant's events together."""

    sequence: int
    kind: Kind
    tenant: str
    key: str
    stage: Stage  # the stage the lookup named (Stage.ANY when none)
    label: str  # what the lookup said the value is about (an image's digest), or ""
    nbytes: int
    tier: str | None  # where the value came from when admitted (None: computed here)
    position: int = 0


def _gap(number: int) -> CacheEvent:
    return CacheEvent(number, GAP, "", "", Stage.ANY, "", 0, None, number)


@final
class Watcher:
    """One subscriber: events of its tenants (None: all), buffered up to ``capacity``.

    A watcher of one tenant counts that tenant's events (``scope``: its name); any other counts
    every tenant's together (``scope`` None), and its events carry that count as ``sequence``."""

    def __init__(self, journal: Journal, tenants: frozenset[str] | None, capacity: int) -> None:
        self._journal = journal
        self.tenants = tenants
        self.scope: str | None = (
            next(iter(tenants)) if tenants is not None and len(tenants) == 1 else EVERY_TENANT
        )
        self.capacity = capacity
        self._buffer: collections.deque[CacheEvent] = collections.deque()
        self._ready = asyncio.Event()
        self.gapped = False
        self.sent = 0
        self.since = 0  # the sequence number its first events bring it to
        self.resumed = False  # its first events: those missed (True) or a snapshot

    def wants(self, tenant: str) -> bool:
        return self.tenants is None or tenant in self.tenants

    def number(self, event: CacheEvent) -> int:
        """``event``'s number in this watcher's count."""
        return event.sequence if self.scope is not EVERY_TENANT else event.position

    def numbered(self, events: Iterable[CacheEvent]) -> list[CacheEvent]:
        """``events`` as this watcher hands them out: ``sequence`` in its own count."""
        if self.scope is not EVERY_TENANT:
            return list(events)
        return [
            e if e.sequence == e.position else dataclasses.replace(e, sequence=e.position)
            for e in events
        ]

    def offer(self, event: CacheEvent) -> None:
        if self.gapped:
            return
        if len(self._buffer) >= self.capacity:
            # behind: one gap after what it holds (the number before this one), and nothing more
            self.gapped = True
            self._journal.gaps += 1
            event = _gap(self.number(event) - 1)
        self._buffer.append(event)
        self._ready.set()

    def gap(self, after: int) -> None:
        """What this watcher was told of is no longer true (the actor was replaced)."""
        if not self.gapped:
            self.gapped = True
            self._journal.gaps += 1
            self._buffer.append(_gap(after))
            self._ready.set()

    def abandon(self) -> None:
        """Its reader stopped taking events (the service's idle limit): it fell behind as a
        full buffer does, counted as one gap unless it already had one, and is closed."""
        if not self.gapped:
            self.gapped = True
            self._journal.gaps += 1
        self._buffer.clear()
        self.close()

    async def next(self) -> list[CacheEvent]:
        """The events buffered since the last call (waits for one); after a gap, the gap last."""
        await self._ready.wait()
        events = self.numbered(self._buffer)
        self._buffer.clear()
        self._ready.clear()
        self.sent += len(events)
        self._journal.sent += len(events)
        return events

    def close(self) -> None:
        self._journal.watchers.discard(self)


@final
class Journal:
    """Sequence numbers, the recent history, and the watchers; touched by the actor's loop."""

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
        self.sent = 0  # events handed to watchers
        self.gaps = 0

    def last(self, scope: str | None) -> int:
        """The last number given in a count: a tenant's, or every tenant's (None)."""
        return self.sequence if scope is EVERY_TENANT else self._counts.get(scope, 0)

    def publish(self, kind: Kind, full_key: FullKey, entry: Entry) -> None:
        tenant, key = full_key
        self.sequence += 1
        number = self._counts[tenant] = self._counts.get(tenant, 0) + 1
        event = CacheEvent(
            number,
            kind,
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
            if watcher.wants(tenant):
                watcher.offer(event)

    def reset(self) -> None:
        """The store these events told of is gone: every watcher starts over."""
        for watcher in self.watchers:
            watcher.gap(self.last(watcher.scope))
        self.history.clear()
        # each count takes one more number, and no resume from before it is answered from the
        # history (it would miss that the entries are gone)
        self.sequence += 1
        self._counts = {tenant: number + 1 for tenant, number in self._counts.items()}
        self._forgotten = dict(self._counts.items())
        self._forgotten[EVERY_TENANT] = self.sequence

    def subscribe(
        self,
        tenants: frozenset[str] | None,
        since: int,
        capacity: int,
        held: Callable[[], Iterable[tuple[FullKey, Entry]]],
    ) -> tuple[Watcher, list[CacheEvent]]:
        """A new watcher and what it is owed first: the events after ``since`` (in its count)
        when the history still has them all, else a snapshot of what is held (``held``
        entries, numbered with the count's last number). Called between two of the actor's
        messages, so nothing is missed or told twice between the two."""
        if len(self.watchers) >= self.max_watchers:
            raise CacheOverloaded(f"{self.max_watchers} cache watchers already")
        watcher = Watcher(self, tenants, capacity)
        last = self.last(watcher.scope)
        if 0 < since <= last and self._forgotten.get(watcher.scope, 0) <= since:
            watcher.resumed = True
            first = watcher.numbered(
                e for e in self.history if watcher.wants(e.tenant) and watcher.number(e) > since
            )
        else:
            first = [
                CacheEvent(last, "held", t, k, e.stage, e.label, e.nbytes, e.tier, last)
                for (t, k), e in held()
                if watcher.wants(t)
            ]
        watcher.since = last
        self.watchers.add(watcher)
        return watcher, first


__all__ = ["GAP", "CacheEvent", "Journal", "Kind", "Watcher"]
