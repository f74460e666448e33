"""The store on its own, with an explicit clock: LRU, budgets and TTL."""

from cache_actor.stats import Counters
from cache_actor.store import Store


def make_store(**kwargs: object) -> tuple[Store, Counters]:
    counters = Counters()
    settings: dict[str, object] = {
        "max_bytes": 100,
        "tenant_budget": 100,
        "max_entry_bytes": 100,
        "ttl_seconds": None,
    }
    settings.update(kwargs)
    return Store(counters=counters, **settings), counters  # type: ignore[arg-type]


def test_ttl_expires_lazily_and_by_sweep() -> None:
    store, counters = make_store(ttl_seconds=10.0)
    store.admit(("t", "a"), b"a", 1, None, now=0.0)
    store.admit(("t", "b"), b"b", 1, None, now=5.0)
    assert store.get(("t", "a"), now=9.9) is not None
    assert store.get(("t", "a"), now=10.0) is None  # lazily, on access
    store.expire(now=15.0)  # by the watchdog's sweep
    assert len(store) == 0
    assert store.bytes == 0
    assert counters.expirations == 2


def test_sweep_skips_entries_admitted_anew() -> None:
    store, counters = make_store(ttl_seconds=10.0)
    store.admit(("t", "a"), b"a", 1, None, now=0.0)
    store.remove(("t", "a"))
    store.admit(("t", "a"), b"a", 1, None, now=8.0)
    store.expire(now=12.0)  # the first admission's expiry must not drop the second
    assert store.peek(("t", "a")) is not None
    assert counters.expirations == 0


def test_zero_byte_entries_keep_tenant_accounting_sane() -> None:
    store, _ = make_store(tenant_budget=50)
    store.admit(("t", "a"), b"", 0, None, now=0.0)
    store.admit(("t", "b"), b"", 0, None, now=0.0)
    assert store.remove(("t", "a"))
    assert store.remove(("t", "b"))
    assert store.bytes_by_tenant() == ()


def test_tenant_budget_keeps_other_tenants() -> None:
    store, counters = make_store(tenant_budget=50)
    store.admit(("quiet", "q"), b"q", 40, None, now=0.0)
    for i in range(5):
        store.admit(("noisy", str(i)), b"n", 30, None, now=0.0)
    assert dict(store.bytes_by_tenant()) == {"quiet": 40, "noisy": 30}
    assert counters.evictions == 4
