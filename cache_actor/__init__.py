"""mmgate's cache actor: one asyncio task owns all cache state; callers await per-key futures.

Identical concurrent lookups share one computation, a computation that asks for its own key (or
closes a cycle of keys) is refused at once, and every wait has a deadline. The package depends on
the standard library only and knows nothing of gRPC or vLLM.
"""

from .actor import CacheActor
from .config import CacheConfig, Weigher, default_weigher
from .errors import (
    CacheActorDead,
    CacheError,
    CacheOverloaded,
    CacheRecursionError,
    ComputeTimeout,
)
from .events import CacheEvent, EventKind, Journal, Watcher, WatchFilter, WatchStats
from .flights import waiting_to_start
from .lookup import Lookup, LookupEvent, LookupHook, Outcome
from .stages import Stage, TierUse
from .stats import CacheStats, EntryInfo
from .tenants import TenantStats
from .tiers import InMemoryTier, SecondTier

__all__ = [
    "CacheActor",
    "CacheActorDead",
    "CacheConfig",
    "CacheError",
    "CacheEvent",
    "CacheOverloaded",
    "CacheRecursionError",
    "CacheStats",
    "ComputeTimeout",
    "EntryInfo",
    "EventKind",
    "InMemoryTier",
    "Journal",
    "Lookup",
    "LookupEvent",
    "LookupHook",
    "Outcome",
    "SecondTier",
    "Stage",
    "TenantStats",
    "TierUse",
    "WatchFilter",
    "WatchStats",
    "Watcher",
    "Weigher",
    "default_weigher",
    "waiting_to_start",
]
