"""Stored values: a byte-budgeted LRU, per tenant as well as in total, with optional TTL.

Only completed values live here; flights are kept apart (flights.py), so eviction cannot touch
work in progress. Everything here is synchronous and touched by the actor's loop only.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, final

from .stages import Stage
from .stats import Counters

FullKey = tuple[str, str]  # (tenant, key)
Change = Literal["admit", "evict", "expire", "invalidate"]


@final
@dataclass(slots=True)
class Entry:
    # what a hit returns, built once at admission: values are immutable, so it is shared
    hit: Any
    nbytes: int
    tier: str | None  # where the flight found it; None when computed
    admitted_at: float
    expires_at: float | None
    hits: int = 0
    stage: Stage = Stage.ANY  # for watchers (events.py): the stage and subject its lookup named
    label: str = ""


@final
class Store:
    def __init__(
        self,
        *,
        max_bytes: int,
        tenant_budget: int,
        max_entry_bytes: int,
        ttl_seconds: float | None,
        counters: Counters,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[Change, FullKey, Entry], None] | None = None,
    ) -> None:
        self._clock = clock
        self._on_change = on_change
        self._max_bytes = max_bytes
        self._tenant_budget = tenant_budget
        self._max_entry_bytes = max_entry_bytes
        self._ttl = ttl_seconds
        self._counters = counters
        self._lru: OrderedDict[FullKey, Entry] = OrderedDict()
        # Kept only when tenants have a budget of their own below the total.
        self._tenant_lru: dict[str, OrderedDict[FullKey, None]] | None = (
            {} if tenant_budget < max_bytes else None
        )
        self._tenant_bytes: dict[str, int] = {}
        self._tenant_entries: dict[str, int] = {}
        # (entries, bytes) by the stage their lookups named
        self._by_stage: dict[Stage, tuple[int, int]] = {}
        # Admission order is expiry order (one TTL for all, values never refreshed); entries that
        # left earlier are skipped by the identity check in ``expire``.
        self._expiry: deque[tuple[float, FullKey, Entry]] = deque()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._lru)

    def bytes_by_tenant(self) -> tuple[tuple[str, int], ...]:
        return tuple(sorted(self._tenant_bytes.items()))

    def by_stage(self) -> tuple[tuple[str, int, int], ...]:
        """(stage, entries, bytes) of each stage with entries held, by stage name."""
        return tuple(sorted((str(s), n, b) for s, (n, b) in self._by_stage.items()))

    def held_by(self, tenant: str) -> tuple[int, int]:
        """(entries, bytes) the tenant holds."""
        return self._tenant_entries.get(tenant, 0), self._tenant_bytes.get(tenant, 0)

    @property
    def tenant_budget(self) -> int:
        return self._tenant_budget

    def get(self, full_key: FullKey) -> Entry | None:
        """The live entry for a key, marked as most recently used."""
        entry = self._lru.get(full_key)
        if entry is None:
            return None
        if entry.expires_at is not None and entry.expires_at <= self._clock():
            self._drop(full_key, entry, "expire")
            self._counters.expirations += 1
            return None
        self._lru.move_to_end(full_key)
        if self._tenant_lru is not None:
            self._tenant_lru[full_key[0]].move_to_end(full_key)
        entry.hits += 1
        return entry

    def peek(self, full_key: FullKey) -> Entry | None:
        return self._lru.get(full_key)

    def admit(
        self,
        full_key: FullKey,
        hit: Any,
        nbytes: int,
        tier: str | None,
        stage: Stage = Stage.ANY,
        label: str = "",
    ) -> bool:
        """Store a completed value, evicting least recently used entries to make room.

        Returns False, storing nothing, when the value is larger than one entry may be.
        """
        if nbytes > self._max_entry_bytes:
            self._counters.oversize_rejections += 1
            return False
        old = self._lru.get(full_key)
        if old is not None:
            self._drop(full_key, old, None)  # replaced: its admit says so
        tenant = full_key[0]
        if self._tenant_lru is not None:
            while self._tenant_bytes.get(tenant, 0) + nbytes > self._tenant_budget:
                self._evict(next(iter(self._tenant_lru[tenant])))
        while self.bytes + nbytes > self._max_bytes:
            self._evict(next(iter(self._lru)))
        now = self._clock()
        expires_at = None if self._ttl is None else now + self._ttl
        entry = Entry(hit, nbytes, tier, now, expires_at, stage=stage, label=label)
        self._lru[full_key] = entry
        if self._tenant_lru is not None:
            self._tenant_lru.setdefault(tenant, OrderedDict())[full_key] = None
        self._tenant_bytes[tenant] = self._tenant_bytes.get(tenant, 0) + nbytes
        self._tenant_entries[tenant] = self._tenant_entries.get(tenant, 0) + 1
        entries, held = self._by_stage.get(stage, (0, 0))
        self._by_stage[stage] = (entries + 1, held + nbytes)
        self.bytes += nbytes
        if expires_at is not None:
            self._expiry.append((expires_at, full_key, entry))
        if self._on_change is not None:
            self._on_change("admit", full_key, entry)
        return True

    def remove(self, full_key: FullKey) -> bool:
        entry = self._lru.get(full_key)
        if entry is None:
            return False
        self._drop(full_key, entry, "invalidate")
        return True

    def expire(self) -> None:
        """Drop every entry whose TTL has passed."""
        now = self._clock()
        while self._expiry and self._expiry[0][0] <= now:
            _, full_key, entry = self._expiry.popleft()
            # identity check: the key may since have been dropped and admitted anew
            if self._lru.get(full_key) is entry:
                self._drop(full_key, entry, "expire")
                self._counters.expirations += 1

    def _evict(self, full_key: FullKey) -> None:
        entry = self._lru[full_key]
        self._drop(full_key, entry, "evict")
        self._counters.evictions += 1
        self._counters.evicted_bytes += entry.nbytes

    def entries(self) -> list[tuple[FullKey, Entry]]:
        """What is held, least recently used first."""
        return list(self._lru.items())

    def _drop(self, full_key: FullKey, entry: Entry, change: Change | None) -> None:
        del self._lru[full_key]
        if change is not None and self._on_change is not None:
            self._on_change(change, full_key, entry)
        tenant = full_key[0]
        if self._tenant_lru is not None:
            order = self._tenant_lru[tenant]
            del order[full_key]
            if not order:
                del self._tenant_lru[tenant]
        remaining = self._tenant_bytes.get(tenant, 0) - entry.nbytes
        if remaining:
            self._tenant_bytes[tenant] = remaining
        else:
            self._tenant_bytes.pop(tenant, None)
        entries = self._tenant_entries[tenant] - 1
        if entries:
            self._tenant_entries[tenant] = entries
        else:
            del self._tenant_entries[tenant]
        entries, held = self._by_stage[entry.stage]
        if entries > 1:
            self._by_stage[entry.stage] = (entries - 1, held - entry.nbytes)
        else:
            del self._by_stage[entry.stage]
        self.bytes -= entry.nbytes
