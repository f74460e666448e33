"""Snapshots the actor hands out: ``CacheStats`` for the whole cache, ``EntryInfo`` for one key.

The actor keeps its running counts in ``Counters`` (mutable, touched only by the actor's loop) and
freezes them into a ``CacheStats`` on request, so nobody outside holds a reference to live state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


def hit_ratio(hits: int, coalesced: int, misses: int) -> float:
    """Share of served lookups that needed no new computation (hits and joins); 0 when idle."""
    total = hits + coalesced + misses
    return (hits + coalesced) / total if total else 0.0


@dataclass(slots=True)
class Counters:
    """Monotonic counts, owned and updated by the actor only."""

    hits: int = 0
    tier_hits: int = 0
    misses: int = 0
    coalesced: int = 0
    load_successes: int = 0
    load_failures: int = 0
    load_seconds: float = 0.0
    evictions: int = 0
    evicted_bytes: int = 0
    expirations: int = 0
    oversize_rejections: int = 0
    recursion_rejections: int = 0
    compute_timeouts: int = 0
    caller_timeouts: int = 0
    cancelled_waiters: int = 0
    overloaded: int = 0
    tier_errors: int = 0
    tier_write_errors: int = 0
    tier_write_drops: int = 0
    stalled_flights: int = 0


@dataclass(frozen=True, slots=True)
class CacheStats:
    """One consistent view of the cache, taken between two messages of the actor."""

    # counters (monotonic)
    hits: int
    tier_hits: int
    misses: int
    coalesced: int
    load_successes: int
    load_failures: int
    load_seconds: float
    evictions: int
    evicted_bytes: int
    expirations: int
    oversize_rejections: int
    recursion_rejections: int
    compute_timeouts: int
    caller_timeouts: int
    cancelled_waiters: int
    overloaded: int
    tier_errors: int
    tier_write_errors: int
    tier_write_drops: int  # write-backs dropped: the write queue was full
    stalled_flights: int
    # gauges
    entries: int
    bytes: int
    bytes_by_tenant: tuple[tuple[str, int], ...]
    flights: int
    waiters: int
    mailbox_depth: int
    loop_lag_seconds: float
    oldest_flight_seconds: float
    tier_breaker_open: bool
    tier_write_queue_depth: int  # write-backs waiting for a writer
    tier: str | None  # the second tier's name; None without one
    alive: bool

    @property
    def lookups(self) -> int:
        """Lookups that ended with a value: hits, misses and coalesced joins."""
        return self.hits + self.misses + self.coalesced

    @property
    def hit_ratio(self) -> float:
        return hit_ratio(self.hits, self.coalesced, self.misses)


EntryState = Literal["stored", "in_flight", "absent"]


@dataclass(frozen=True, slots=True)
class EntryInfo:
    """What the actor holds for one key."""

    tenant: str
    key: str
    state: EntryState
    nbytes: int = 0
    age_seconds: float = 0.0
    hits: int = 0
    tier: str | None = None
    expires_in: float | None = None
    waiters: int = 0
