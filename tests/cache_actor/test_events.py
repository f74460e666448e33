"""The store's events for watchers: admits, evictions and invalidations, numbered, per tenant;
resuming from a sequence number; a snapshot when the history no longer reaches back, then
"synced"; a watcher of one stage told of that stage alone; a watcher that does not read costs a
bounded buffer and ends with one gap; one its reader abandons gives its slot back; the journal's
own counts of all of it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from cache_actor import (
    CacheActor,
    CacheConfig,
    CacheEvent,
    CacheOverloaded,
    EventKind,
    Journal,
    Stage,
    WatchFilter,
    WatchStats,
)

pytestmark = pytest.mark.asyncio

IMAGE = Stage.IMAGE.tier_use
EVERY = WatchFilter(tenants=None)  # every tenant's events, of every stage


def of(tenant: str) -> WatchFilter:
    """One tenant's events, of every stage."""
    return WatchFilter(frozenset({tenant}))


def value_of(size: int) -> Callable[[], Awaitable[bytes]]:
    async def compute() -> bytes:
        return b"x" * size

    return compute


def actor(journal: Journal, max_bytes: int = 10_000) -> CacheActor:
    config = CacheConfig(max_bytes=max_bytes, max_entry_fraction=0.6)
    cache = CacheActor(config, journal=journal)
    cache.start()
    return cache


def kinds(events: list[CacheEvent]) -> list[tuple[str, str, str]]:
    return [(e.kind, e.tenant, e.key) for e in events]


async def test_admits_evictions_and_invalidations_reach_a_tenants_watcher() -> None:
    journal = Journal()
    cache = actor(journal)
    mine, _ = await cache.watch(of("a"), 0, capacity=100)
    theirs, _ = await cache.watch(of("b"), 0, capacity=100)
    await cache.get("k1", value_of(3000), tenant="a", tier=IMAGE, label="sha256:one")
    await cache.get("k2", value_of(3000), tenant="a")
    await cache.get("k3", value_of(4500), tenant="a")  # over 10,000 bytes: k1 goes
    assert await cache.invalidate("k2", tenant="a")
    events = await mine.next()
    assert kinds(events) == [
        ("admit", "a", "k1"),
        ("admit", "a", "k2"),
        ("evict", "a", "k1"),
        ("admit", "a", "k3"),
        ("invalidate", "a", "k2"),
    ]
    first = events[0]
    assert (first.stage, first.label, first.tier) == ("image", "sha256:one", None)
    assert first.nbytes >= 3000
    assert [e.sequence for e in events] == [1, 2, 3, 4, 5]
    await cache.get("other", value_of(10), tenant="b")
    assert kinds(await theirs.next()) == [("admit", "b", "other")]  # a's events: none
    await cache.aclose()


async def test_a_new_watcher_starts_with_what_is_held() -> None:
    journal = Journal()
    cache = actor(journal)
    await cache.get("k1", value_of(10), tenant="a")
    await cache.get("k2", value_of(10), tenant="b")
    _, first = await cache.watch(of("a"), 0, capacity=10)
    assert kinds(first) == [("held", "a", "k1")]
    assert first[0].sequence == 1  # a's own count: b's admit is none of a's business
    _, everyone = await cache.watch(EVERY, 0, capacity=10)
    assert {e.key for e in everyone} == {"k1", "k2"}
    assert {e.sequence for e in everyone} == {journal.sequence} == {2}  # every tenant's count
    await cache.aclose()


async def test_a_watcher_resuming_gets_exactly_the_events_it_missed() -> None:
    journal = Journal(history=8)
    cache = actor(journal)
    watcher, _ = await cache.watch(of("a"), 0, capacity=10)
    await cache.get("k1", value_of(10), tenant="a")
    (seen,) = await watcher.next()
    watcher.close()  # the caller goes away; three more events meanwhile
    for key in ("k2", "k3"):
        await cache.get(key, value_of(10), tenant="a")
    await cache.get("elsewhere", value_of(10), tenant="b")
    assert await cache.invalidate("k1", tenant="a")
    _, missed = await cache.watch(of("a"), seen.sequence, capacity=10)
    assert kinds(missed) == [("admit", "a", "k2"), ("admit", "a", "k3"), ("invalidate", "a", "k1")]
    # further back than the history holds: a snapshot instead
    for n in range(10):
        await cache.get(f"more{n}", value_of(10), tenant="b")
    _, snapshot = await cache.watch(of("a"), seen.sequence, capacity=10)
    assert kinds(snapshot) == [("held", "a", "k2"), ("held", "a", "k3")]
    await cache.aclose()


async def test_a_watcher_that_does_not_read_ends_with_one_gap() -> None:
    journal = Journal()
    cache = actor(journal, max_bytes=1_000_000)
    watcher, _ = await cache.watch(EVERY, 0, capacity=50)
    for n in range(1000):
        await cache.get(f"k{n}", value_of(10))
    events = await watcher.next()
    assert len(events) == 51
    assert [e.kind for e in events[-2:]] == ["admit", "gap"]
    assert events[-1].sequence == events[-2].sequence  # resume after the last one it has
    assert journal.gaps == 1
    assert len(journal.history) <= 4096  # and the history is bounded too
    await cache.aclose()


async def test_watchers_are_bounded() -> None:
    cache = actor(Journal(max_watchers=2))
    for _ in range(2):
        await cache.watch(EVERY, 0, capacity=10)
    with pytest.raises(CacheOverloaded, match="2 cache watchers"):
        await cache.watch(EVERY, 0, capacity=10)
    assert cache.alive  # a refused watch is the caller's error, not the actor's
    await cache.aclose()


async def test_a_reset_gaps_every_watcher_and_its_history_is_not_replayed() -> None:
    journal = Journal()
    cache = actor(journal)
    watcher, _ = await cache.watch(EVERY, 0, capacity=10)
    await cache.get("k1", value_of(10))
    (seen,) = await watcher.next()
    journal.reset()  # the actor these events told of is gone
    (gap,) = await watcher.next()
    assert (gap.kind, gap.sequence) == ("gap", seen.sequence)
    fresh = actor(journal)  # its replacement, empty
    _, first = await fresh.watch(EVERY, gap.sequence, capacity=10)
    assert first == []  # a snapshot of nothing, not a replay of k1's admit
    assert journal.sequence > gap.sequence
    await asyncio.gather(cache.aclose(), fresh.aclose())


async def test_a_sequence_number_from_another_life_gets_a_snapshot() -> None:
    """A number this journal never gave (another replica's, or from before a restart)."""
    journal = Journal()
    cache = actor(journal)
    await cache.get("k1", value_of(10), tenant="a")
    watcher, first = await cache.watch(of("a"), journal.sequence + 100, capacity=10)
    assert kinds(first) == [("held", "a", "k1")]
    assert not watcher.resumed
    await cache.aclose()


async def test_each_tenants_events_are_numbered_on_their_own() -> None:
    """A tenant's numbers move with its own events alone: another tenant's admits leave no
    holes in them. A watcher of every tenant counts all of them together."""
    journal = Journal()
    cache = actor(journal)
    mine, _ = await cache.watch(of("a"), 0, capacity=10)
    theirs, _ = await cache.watch(of("b"), 0, capacity=10)
    everyone, _ = await cache.watch(EVERY, 0, capacity=10)
    for tenant, key in (("a", "a1"), ("b", "b1"), ("b", "b2"), ("a", "a2"), ("b", "b3")):
        await cache.get(key, value_of(10), tenant=tenant)
    assert [(e.key, e.sequence) for e in await mine.next()] == [("a1", 1), ("a2", 2)]
    assert [(e.key, e.sequence) for e in await theirs.next()] == [("b1", 1), ("b2", 2), ("b3", 3)]
    assert [e.sequence for e in await everyone.next()] == [1, 2, 3, 4, 5]
    # a new watcher of a is synced at a's count, whatever b did
    again, _ = await cache.watch(of("a"), 0, capacity=10)
    assert (again.since, journal.sequence) == (2, 5)
    await cache.aclose()


async def test_a_tenant_resumes_in_its_own_count() -> None:
    """Resuming from a tenant's number: exactly the tenant's events missed, numbered as before,
    while the shared history still holds them all; a snapshot once it does not."""
    journal = Journal(history=4)
    cache = actor(journal)
    await cache.get("a1", value_of(10), tenant="a")  # a's 1: the watcher saw it, then went
    for tenant, key in (("b", "b1"), ("b", "b2"), ("a", "a2"), ("a", "a3")):
        await cache.get(key, value_of(10), tenant=tenant)
    watcher, missed = await cache.watch(of("a"), 1, capacity=10)
    assert watcher.resumed  # a1 has left the history, but it was seen: nothing a missed has
    assert [(e.key, e.sequence) for e in missed] == [("a2", 2), ("a3", 3)]
    assert watcher.since == 3
    # every tenant's count resumes the same way, from its own number (b1 is the 2nd event)
    _, everyone = await cache.watch(EVERY, 2, capacity=10)
    assert [(e.key, e.sequence) for e in everyone] == [("b2", 3), ("a2", 4), ("a3", 5)]
    for key in ("b3", "b4", "b5"):  # b's events push a2 out of the history
        await cache.get(key, value_of(10), tenant="b")
    watcher, snapshot = await cache.watch(of("a"), 1, capacity=10)
    assert not watcher.resumed
    assert {e.key for e in snapshot} == {"a1", "a2", "a3"}
    assert {e.sequence for e in snapshot} == {3}
    _, missed = await cache.watch(of("a"), 2, capacity=10)  # a3 is still held
    assert [(e.key, e.sequence) for e in missed] == [("a3", 3)]
    await cache.aclose()


async def test_an_abandoned_watcher_gives_its_slot_back() -> None:
    """The service abandons a watcher whose reader took nothing for too long: it counts as one
    gap, holds nothing more, and a new watcher may take its place."""
    journal = Journal(max_watchers=1)
    cache = actor(journal)
    watcher, _ = await cache.watch(EVERY, 0, capacity=10)
    await cache.get("k1", value_of(10))
    with pytest.raises(CacheOverloaded):
        await cache.watch(EVERY, 0, capacity=10)
    watcher.abandon()
    assert (journal.gaps, journal.watchers) == (1, set())
    await cache.get("k2", value_of(10))
    assert watcher.sent == 0
    again, _ = await cache.watch(EVERY, 0, capacity=10)
    watcher.abandon()  # twice, or after a gap: still one gap
    assert journal.gaps == 1
    again.close()
    await cache.aclose()


async def test_synced_ends_what_a_watcher_was_owed() -> None:
    """After a snapshot, "synced" says so (what is held is exactly the held events before it);
    after the events missed, it does not. Either way it carries the number live events follow."""
    journal = Journal()
    cache = actor(journal)
    await cache.get("k1", value_of(10), tenant="a")
    fresh, snapshot = await cache.watch(of("a"), 0, capacity=10)
    assert [(e.kind, e.snapshot) for e in snapshot] == [(EventKind.HELD, True)]
    assert (fresh.synced.kind, fresh.synced.sequence, fresh.synced.snapshot) == ("synced", 1, True)
    await cache.get("k2", value_of(10), tenant="a")
    resumed, missed = await cache.watch(of("a"), 1, capacity=10)
    assert [(e.key, e.snapshot) for e in missed] == [("k2", False)]
    synced = resumed.synced
    assert (synced.kind, synced.sequence, synced.snapshot) == ("synced", 2, False)
    assert (synced.tenant, synced.key, synced.stage) == ("", "", Stage.ANY)
    await cache.aclose()


async def test_a_watcher_of_one_stage_is_told_of_that_stage_alone() -> None:
    """The journal applies the stage as it applies the tenants: in the snapshot, the events
    missed and live; the other stages' events take nothing of its buffer, and its numbers stay
    its tenant's count."""
    journal = Journal()
    cache = actor(journal, max_bytes=1_000_000)
    images = WatchFilter(frozenset({"a"}), Stage.IMAGE)
    await cache.get("i1", value_of(10), tenant="a", tier=IMAGE)
    await cache.get("p1", value_of(10), tenant="a", tier=Stage.PROMPT.tier_use)
    await cache.get("i2", value_of(10), tenant="b", tier=IMAGE)
    watcher, snapshot = await cache.watch(images, 0, capacity=2)
    assert kinds(snapshot) == [("held", "a", "i1")]
    for n in range(5):  # more than its buffer holds, none of them its stage
        await cache.get(f"p{n + 2}", value_of(10), tenant="a", tier=Stage.PROMPT.tier_use)
    await cache.get("i3", value_of(10), tenant="a", tier=IMAGE)
    events = await watcher.next()
    assert [(e.kind, e.key, e.sequence) for e in events] == [("admit", "i3", 8)]
    assert not watcher.gapped
    _, missed = await cache.watch(images, 1, capacity=10)
    assert kinds(missed) == [("admit", "a", "i3")]
    await cache.aclose()


async def test_the_journal_counts_what_it_did() -> None:
    """Its figures (the service's Cache.Watch metrics): the watchers subscribed, the events it
    handed them (a gap included) and the gaps; closing a watcher counts nothing."""
    journal = Journal()
    cache = actor(journal)
    assert journal.figures() == WatchStats()
    behind, _ = await cache.watch(EVERY, 0, capacity=1)
    reader, _ = await cache.watch(of("a"), 0, capacity=10)
    for key in ("k1", "k2"):
        await cache.get(key, value_of(10), tenant="a")
    assert journal.figures() == WatchStats(watchers=2, events=4, gaps=1)  # 1 + gap, 2
    assert [e.kind for e in await behind.next()] == ["admit", "gap"]
    assert behind.ended
    behind.close()
    reader.close()
    assert journal.figures() == WatchStats(watchers=0, events=4, gaps=1)
    await cache.aclose()
