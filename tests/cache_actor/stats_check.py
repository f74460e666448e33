"""Exact statistics after each test (async-lru's ``check_lru``): every counter the test did not
name must be zero."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from cache_actor import CacheActor, CacheStats

COUNTERS = (
    "hits",
    "tier_hits",
    "misses",
    "coalesced",
    "load_successes",
    "load_failures",
    "evictions",
    "evicted_bytes",
    "expirations",
    "oversize_rejections",
    "recursion_rejections",
    "compute_timeouts",
    "caller_timeouts",
    "cancelled_waiters",
    "overloaded",
    "tier_errors",
    "tier_write_errors",
    "stalled_flights",
)


def assert_stats(cache: CacheActor, **expected: Any) -> CacheStats:
    """Assert the named stats exactly and every counter not named to be zero (async-lru style)."""
    stats = cache.stats()
    actual = dataclasses.asdict(stats)
    wanted = {name: 0 for name in COUNTERS} | expected
    assert {name: actual[name] for name in wanted} == wanted
    return stats


MakeActor = Callable[..., CacheActor]


__all__ = ["COUNTERS", "MakeActor", "assert_stats"]
