"""Per-tenant counts: what each tenant's lookups did, for that tenant's own view of the cache.

Tenant names may come from callers (a label anyone can set where nothing authenticates them), so
the ledger is bounded: beyond ``max_tenants`` the tenant idle the longest is forgotten. Its
entries stay in the store, bounded by bytes as they always are; only its counts start again.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import final

from .stats import hit_ratio


@final
@dataclass(slots=True)
class TenantCounters:
    """One tenant's monotonic counts, owned and updated by the actor only."""

    hits: int = 0
    tier_hits: int = 0
    misses: int = 0
    coalesced: int = 0
    load_failures: int = 0


@final
@dataclass(frozen=True, slots=True)
class TenantStats:
    """One tenant's lookups and what it holds, taken between two messages of the actor."""

    tenant: str
    hits: int
    tier_hits: int
    misses: int
    coalesced: int
    load_failures: int
    entries: int
    bytes: int
    budget_bytes: int  # what the tenant may hold

    @property
    def hit_ratio(self) -> float:
        return hit_ratio(self.hits, self.coalesced, self.misses)


@final
class TenantLedger:
    def __init__(self, max_tenants: int) -> None:
        self.max_tenants = max_tenants
        self._counts: OrderedDict[str, TenantCounters] = OrderedDict()
        self.forgotten = 0  # tenants whose counts were dropped to stay within max_tenants

    def __call__(self, tenant: str) -> TenantCounters:
        """The tenant's counters, marked as most recently used (created, within the bound)."""
        counts = self._counts.get(tenant)
        if counts is not None:
            self._counts.move_to_end(tenant)
            return counts
        counts = self._counts[tenant] = TenantCounters()
        while len(self._counts) > self.max_tenants:
            self._counts.popitem(last=False)
            self.forgotten += 1
        return counts

    def peek(self, tenant: str) -> TenantCounters:
        """The tenant's counters without touching the order (zeros when none are kept)."""
        return self._counts.get(tenant) or TenantCounters()

    def tenants(self) -> tuple[str, ...]:
        return tuple(self._counts)

    def __len__(self) -> int:
        return len(self._counts)
