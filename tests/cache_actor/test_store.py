"""The store on its own, with a clock the test moves: LRU, budgets and TTL."""

from typing import Any

from cache_actor.stats import Counters
from cache_actor.store import FullKey, Store


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make_store(**settings: Any) -> tuple[Store, Counters, Clock]:
    counters, clock = Counters(), Clock()
    defaults: dict[str, Any] = {
        "max_bytes": 100,
        "tenant_budget": 100,
        "max_entry_bytes": 100,
        "ttl_seconds": None,
    }
    store = Store(counters=counters, clock=clock, **(defaults | settings))
    return store, counters, clock


def admit(store: Store, full_key: FullKey, nbytes: int) -> bool:
    return store.admit(full_key, hit=None, nbytes=nbytes, tier=None)


def test_ttl_expires_lazily_and_by_sweep() -> None:
    store, counters, clock = make_store(ttl_seconds=10.0)
    admit(store, ("t", "a"), 1)
    clock.now = 5.0
    admit(store, ("t", "b"), 1)
    clock.now = 9.9
    assert store.get(("t", "a")) is not None
    clock.now = 10.0
    assert store.get(("t", "a")) is None  # lazily, on access
    clock.now = 15.0
    store.expire()  # by the watchdog's sweep
    assert len(store) == 0
    assert store.bytes == 0
    assert counters.expirations == 2


def test_sweep_skips_entries_admitted_anew() -> None:
    store, counters, clock = make_store(ttl_seconds=10.0)
    admit(store, ("t", "a"), 1)
    store.remove(("t", "a"))
    clock.now = 8.0
    admit(store, ("t", "a"), 1)
    clock.now = 12.0
    store.expire()  # the first admission's expiry must not drop the second
    assert store.peek(("t", "a")) is not None
    assert counters.expirations == 0


def test_zero_byte_entries_keep_tenant_accounting_sane() -> None:
    store, _, _ = make_store(tenant_budget=50)
    admit(store, ("t", "a"), 0)
    admit(store, ("t", "b"), 0)
    assert store.remove(("t", "a"))
    assert store.remove(("t", "b"))
    assert store.bytes_by_tenant() == ()


def test_tenant_budget_keeps_other_tenants() -> None:
    store, counters, _ = make_store(tenant_budget=50)
    admit(store, ("quiet", "q"), 40)
    for i in range(5):
        admit(store, ("noisy", str(i)), 30)
    assert dict(store.bytes_by_tenant()) == {"quiet": 40, "noisy": 30}
    assert counters.evictions == 4


def test_oversized_value_is_refused() -> None:
    store, counters, _ = make_store(max_entry_bytes=10)
    assert not admit(store, ("t", "big"), 11)
    assert counters.oversize_rejections == 1
    assert len(store) == 0


def test_holdings_by_stage_follow_admission_replacement_eviction_and_removal() -> None:
    from cache_actor.stages import Stage

    store, _, _ = make_store(max_bytes=10)
    store.admit(("t", "p1"), hit=None, nbytes=2, tier=None, stage=Stage.PROMPT)
    store.admit(("t", "i1"), hit=None, nbytes=3, tier=None, stage=Stage.IMAGE)
    store.admit(("u", "i2"), hit=None, nbytes=4, tier=None, stage=Stage.IMAGE)
    assert store.by_stage() == (("image", 2, 7), ("prompt", 1, 2))
    store.admit(("t", "i1"), hit=None, nbytes=1, tier=None, stage=Stage.IMAGE)  # replaced
    assert store.by_stage() == (("image", 2, 5), ("prompt", 1, 2))
    # 6 more bytes: the least recently used go, p1 then i2
    store.admit(("t", "e1"), hit=None, nbytes=6, tier=None, stage=Stage.EMBEDDING)
    assert store.by_stage() == (("embedding", 1, 6), ("image", 1, 1))
    assert store.remove(("t", "i1"))
    assert store.by_stage() == (("embedding", 1, 6),)
    assert sum(b for _, _, b in store.by_stage()) == store.bytes
