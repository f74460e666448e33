"""Settings of one cache actor. ``CacheConfig()`` is a sensible default for a single server."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

Weigher = Callable[[Any], int]

MiB = 1024 * 1024


def default_weigher(value: Any) -> int:
    """Bytes a value holds: ``nbytes`` for arrays and tensors, ``len`` for byte strings.

    numpy arrays and torch tensors both expose ``nbytes``; anything else falls back to
    ``sys.getsizeof``, which undercounts containers, so give the actor a weigher of your own
    when you cache those.
    """
    nbytes = getattr(value, "nbytes", None)
    if isinstance(nbytes, int):
        return nbytes
    if isinstance(value, bytes | bytearray | memoryview | str):
        return len(value)
    return sys.getsizeof(value)


@dataclass(frozen=True, slots=True)
class CacheConfig:
    """How much the actor may hold and how long anything may wait.

    Every wait has a deadline: ``default_timeout`` applies when a caller passes none, and a flight
    is cancelled ``compute_deadline`` seconds after it starts, whoever still waits on it.
    """

    max_bytes: int = 512 * MiB
    # None: each tenant may use the whole budget.
    max_bytes_per_tenant: int | None = None
    # A value larger than this fraction of the (tenant's) budget is returned but not stored.
    max_entry_fraction: float = 0.05
    # Memory hygiene, not freshness: keys are content hashes, so values never go stale.
    ttl_seconds: float | None = None
    mailbox_size: int = 4096
    max_flights: int = 10_000
    default_timeout: float = 30.0
    compute_deadline: float = 60.0
    # Keep a flight running when its last waiter leaves: the same image is likely asked for again.
    finish_orphaned_flights: bool = True
    weigher: Weigher = field(default=default_weigher)
    tier_timeout: float = 0.25
    # Circuit breaker of the second tier: after this many consecutive failures, stop asking it
    # for ``tier_breaker_seconds``.
    tier_breaker_failures: int = 5
    tier_breaker_seconds: float = 10.0
    # Write-backs wait in a queue of this many (beyond it they are dropped, counted) for
    # ``tier_writers`` tasks: a slow tier never holds more than this in memory.
    tier_write_queue: int = 256
    tier_writers: int = 2
    # Tenants whose counts are kept (TenantLedger); beyond it the longest idle are forgotten.
    max_tenants: int = 1024
    watchdog_interval: float = 1.0
    # A flight older than this is logged with its task's stack.
    stall_threshold: float = 10.0
    # Loop lag above this is logged: CPU-bound work is running on the event loop.
    loop_lag_warning: float = 0.25

    def __post_init__(self) -> None:
        positive = {
            "max_bytes": self.max_bytes,
            "mailbox_size": self.mailbox_size,
            "max_flights": self.max_flights,
            "default_timeout": self.default_timeout,
            "compute_deadline": self.compute_deadline,
            "tier_timeout": self.tier_timeout,
            "tier_breaker_failures": self.tier_breaker_failures,
            "tier_write_queue": self.tier_write_queue,
            "tier_writers": self.tier_writers,
            "watchdog_interval": self.watchdog_interval,
            "stall_threshold": self.stall_threshold,
            "loop_lag_warning": self.loop_lag_warning,
        }
        if self.max_bytes_per_tenant is not None:
            positive["max_bytes_per_tenant"] = self.max_bytes_per_tenant
        if self.ttl_seconds is not None:
            positive["ttl_seconds"] = self.ttl_seconds
        for name, value in positive.items():
            if not value > 0:
                raise ValueError(f"CacheConfig.{name} must be positive, got {value!r}")
        if not 0 < self.max_entry_fraction <= 1:
            raise ValueError(
                f"CacheConfig.max_entry_fraction must be in (0, 1], got {self.max_entry_fraction!r}"
            )
        if self.tier_breaker_seconds < 0:
            raise ValueError("CacheConfig.tier_breaker_seconds must not be negative")

    @property
    def tenant_budget(self) -> int:
        """Bytes one tenant may hold."""
        if self.max_bytes_per_tenant is None:
            return self.max_bytes
        return min(self.max_bytes, self.max_bytes_per_tenant)

    @property
    def max_entry_bytes(self) -> int:
        """The largest value that is admitted to memory."""
        return int(self.tenant_budget * self.max_entry_fraction)
