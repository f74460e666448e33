"""What the store did, as a stream: admits, evictions, expiries and invalidations, numbered.

    store (actor loop) ─ publish(kind, key, entry) ─▶ Journal: next sequence number
                                                        ├─▶ history (the last N events: resume)
                                                        └─▶ each Watcher whose tenants match:
                                                            a bounded buffer, then one "gap"

Publishing never waits and never grows without bound: a watcher that does not read fills its
buffer, gets a single "gap" event after what it holds and nothing more (its stream ends there;
its client resumes from the last sequence number it saw, or starts over with a snapshot). The
journal outlives any one actor: when an actor dies, every watcher gets a gap and the history is
cleared, since what it told of is gone with the actor.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final, Literal, final

from .errors import CacheOverloaded
from .store import Entry, FullKey

Kind = Literal["held", "admit", "evict", "expire", "invalidate", "gap"]
GAP: Final = "gap"


@final
@dataclass(frozen=True, slots=True)
class CacheEvent:
    """One change to what the store holds (``held``: an entry of a snapshot)."""

    sequence: int
    kind: Kind
    tenant: str
    key: str
    stage: str  # the stage the lookup named ("" when none)
    label: str  # what the lookup said the value is about (an image's digest), or ""
    nbytes: int
    tier: str | None  # where the value came from when admitted (None: computed here)


@final
class Watcher:
    """One subscriber: events of its tenants (None: all), buffered up to ``capacity``."""

    def __init__(self, journal: Journal, tenants: frozenset[str] | None, capacity: int) -> None:
        self._journal = journal
        self.tenants = tenants
        self.capacity = capacity
        self._buffer: collections.deque[CacheEvent] = collections.deque()
        self._ready = asyncio.Event()
        self.gapped = False
        self.sent = 0
        self.since = 0  # the sequence number its first events bring it to
        self.resumed = False  # its first events: those missed (True) or a snapshot

    def wants(self, tenant: str) -> bool:
        return self.tenants is None or tenant in self.tenants

    def offer(self, event: CacheEvent) -> None:
        if self.gapped:
            return
        if len(self._buffer) >= self.capacity:
            # behind: one gap after what it holds, and nothing more
            self.gapped = True
            self._journal.gaps += 1
            event = CacheEvent(event.sequence - 1, GAP, "", "", "", "", 0, None)
        self._buffer.append(event)
        self._ready.set()

    def gap(self, after: int) -> None:
        """What this watcher was told of is no longer true (the actor was replaced)."""
        if not self.gapped:
            self.gapped = True
            self._journal.gaps += 1
            self._buffer.append(CacheEvent(after, GAP, "", "", "", "", 0, None))
            self._ready.set()

    async def next(self) -> list[CacheEvent]:
        """The events buffered since the last call (waits for one); after a gap, the gap last."""
        await self._ready.wait()
        events = list(self._buffer)
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

    def __init__(self, history: int = 4096, max_watchers: int = 16) -> None:
        self.history: collections.deque[CacheEvent] = collections.deque(maxlen=history)
        self.max_watchers = max_watchers
        self.watchers: set[Watcher] = set()
        self.sequence = 0  # the last number given
        self.sent = 0  # events handed to watchers
        self.gaps = 0

    def publish(self, kind: Kind, full_key: FullKey, entry: Entry) -> None:
        self.sequence += 1
        tenant, key = full_key
        event = CacheEvent(
            self.sequence, kind, tenant, key, entry.stage, entry.label, entry.nbytes, entry.tier
        )
        self.history.append(event)
        for watcher in self.watchers:
            if watcher.wants(tenant):
                watcher.offer(event)

    def reset(self) -> None:
        """The store these events told of is gone: every watcher starts over."""
        for watcher in self.watchers:
            watcher.gap(self.sequence)
        self.history.clear()
        self.sequence += 1  # no resume from before this point is answered from the history

    def subscribe(
        self,
        tenants: frozenset[str] | None,
        since: int,
        capacity: int,
        held: Callable[[], Iterable[tuple[FullKey, Entry]]],
    ) -> tuple[Watcher, list[CacheEvent]]:
        """A new watcher and what it is owed first: the events after ``since`` when the history
        still has them all, else a snapshot of what is held (``held`` entries, numbered with
        the current sequence). Called between two of the actor's messages, so nothing is missed
        or told twice between the two."""
        if len(self.watchers) >= self.max_watchers:
            raise CacheOverloaded(f"{self.max_watchers} cache watchers already")
        watcher = Watcher(self, tenants, capacity)
        oldest = self.history[0].sequence if self.history else self.sequence + 1
        if 0 < since <= self.sequence and oldest <= since + 1:
            watcher.resumed = True
            first = [e for e in self.history if e.sequence > since and watcher.wants(e.tenant)]
        else:
            first = [
                CacheEvent(self.sequence, "held", t, k, e.stage, e.label, e.nbytes, e.tier)
                for (t, k), e in held()
                if watcher.wants(t)
            ]
        watcher.since = self.sequence
        self.watchers.add(watcher)
        return watcher, first


__all__ = ["GAP", "CacheEvent", "Journal", "Kind", "Watcher"]
