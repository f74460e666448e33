"""mmgate's queue for the engine, alone: its order, its shares and its bookkeeping.

A test clock stands in run lengths (the queue charges slot-seconds); the real engine's tests are
in tests/services/api/test_fair_shares.py.
"""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from services.config import TenantSettings
from services.pipeline.queue import EngineQueue, Slot
from tests.support import Clock

pytestmark = pytest.mark.asyncio


def queue(
    slots: int | None = 2,
    newcomers: int = 0,
    alternatives: int | None = None,
    **scheduling: dict[str, int | float],
) -> EngineQueue:
    """The fair order alone by default: no slot kept for newcomers, no bound on alternatives."""
    tenants = TenantSettings(scheduling=scheduling, newcomer_slots=newcomers)
    return EngineQueue(slots, tenants, Clock(), alternatives=alternatives)


def clock_of(q: EngineQueue) -> Clock:
    assert isinstance(q.clock, Clock)
    return q.clock


async def settle() -> None:
    """Let every task woken by a grant run up to its next wait."""
    for _ in range(5):
        await asyncio.sleep(0)


class Runs:
    """Waiters started in order, and the order in which they got their slots."""

    def __init__(self, q: EngineQueue) -> None:
        self.q = q
        self.granted: list[str] = []
        self.slots: dict[str, Slot] = {}
        self.tasks: dict[str, asyncio.Task[None]] = {}

    def start(
        self, name: str, tenant: str, priority: int = 0, cost: int = 1, alternatives: int = 0
    ) -> None:
        async def wait() -> None:
            self.slots[name] = await self.q.acquire(tenant, priority, cost, alternatives)
            self.granted.append(name)

        self.tasks[name] = asyncio.ensure_future(wait())

    def end(self, name: str, after: float = 1.0) -> None:
        clock_of(self.q).now += after
        self.q.release(self.slots.pop(name))


async def test_within_a_tenant_the_more_urgent_goes_first_then_arrival() -> None:
    q = queue(slots=1)
    runs = Runs(q)
    runs.start("running", "a")
    await settle()
    for name, priority in (("late", 5), ("urgent", -1), ("normal", 0), ("normal2", 0)):
        runs.start(name, "a", priority)
    await settle()
    for expected in ("urgent", "normal", "normal2", "late"):
        runs.end(next(iter(runs.slots)))
        await settle()
        assert runs.granted[-1] == expected
    assert q.stats().tenants["a"].granted == 5


async def test_one_tenant_alone_gets_every_slot_beyond_any_share() -> None:
    q = queue(slots=4, a={"weight": 1}, b={"weight": 3})
    runs = Runs(q)
    for i in range(6):
        runs.start(f"a{i}", "a")
    await settle()
    assert runs.granted == ["a0", "a1", "a2", "a3"]
    assert q.in_use == 4
    assert q.stats().tenants["a"].waiting == 2


async def saturate(q: EngineQueue, tenants: dict[str, int], rounds: int) -> Counter[str]:
    """Each tenant keeps ``tenants[t]`` waiting; each round the oldest run ends after 1 s."""
    runs = Runs(q)
    counter = 0
    for tenant, backlog in tenants.items():
        for _ in range(backlog):
            runs.start(f"{tenant}{counter}", tenant)
            counter += 1
    await settle()
    done: Counter[str] = Counter()
    for _ in range(rounds):
        oldest = next(iter(runs.slots))
        tenant = oldest.rstrip("0123456789")
        runs.end(oldest, after=1.0 / max(1, q.in_use))
        done[tenant] += 1
        runs.start(f"{tenant}{counter}", tenant)  # it keeps its backlog
        counter += 1
        await settle()
    for task in runs.tasks.values():
        task.cancel()
    await settle()
    return done


async def test_weights_3_to_1_share_the_slots_3_to_1() -> None:
    q = queue(slots=8, heavy={"weight": 3}, light={"weight": 1})
    done = await saturate(q, {"heavy": 20, "light": 20}, rounds=400)
    assert 2.8 <= done["heavy"] / done["light"] <= 3.2, done


async def test_equal_weights_share_equally_whoever_came_first() -> None:
    q = queue(slots=8)
    done = await saturate(q, {"first": 40, "second": 5}, rounds=400)
    assert 0.9 <= done["first"] / done["second"] <= 1.1, done


async def test_long_runs_cost_what_they_hold() -> None:
    """Equal weights, one tenant's runs 4x as long: each holds about half the engine's time."""
    q = queue(slots=4)
    runs = Runs(q)
    held: dict[str, float] = {"long": 0.0, "short": 0.0}
    for i in range(12):
        runs.start(f"long{i}", "long")
        runs.start(f"short{i}", "short")
    await settle()
    ends: list[tuple[float, str]] = []  # (end time, run) of the running ones
    clock = clock_of(q)
    for name in list(runs.slots):
        ends.append((clock.now + (4.0 if name.startswith("long") else 1.0), name))
    for _ in range(60):
        ends.sort()
        at, name = ends.pop(0)
        slot = runs.slots[name]
        held[slot.tenant] += at - slot.started
        clock.now = at
        q.release(runs.slots.pop(name))
        tenant = slot.tenant
        runs.start(f"{tenant}-{at}", tenant)
        await settle()
        for new in runs.slots:
            if all(new != n for _, n in ends):
                ends.append((clock.now + (4.0 if new.startswith("long") else 1.0), new))
    assert 0.7 <= held["long"] / held["short"] <= 1.4, held
    for task in runs.tasks.values():
        task.cancel()


async def test_an_idle_tenant_saves_up_no_credit() -> None:
    q = queue(slots=1)
    runs = Runs(q)
    runs.start("late-first", "late")
    runs.start("busy0", "busy")
    await settle()
    runs.end("late-first", after=5.0)  # late leaves, having used more than busy
    await settle()
    for i in range(1, 50):
        runs.end(f"busy{i - 1}")
        runs.start(f"busy{i}", "busy")
        await settle()
    # late comes back after busy ran 49 s alone: it is owed nothing for the time it was away
    for i in range(4):
        runs.start(f"late{i}", "late")
    runs.start("busy50", "busy")
    await settle()
    order = []
    for _ in range(4):
        runs.end(next(iter(runs.slots)))
        await settle()
        order.append(runs.granted[-1])
    # it starts level with busy's run in progress, not 44 s of credit ahead: one run each
    # from there (its first is the one busy's running run already stands against)
    assert order.index("busy50") <= 2, order


async def test_a_caller_that_leaves_while_waiting_leaves_nothing_behind() -> None:
    q = queue(slots=1)
    runs = Runs(q)
    runs.start("running", "a")
    runs.start("leaver", "b")
    runs.start("next", "c")
    await settle()
    runs.tasks["leaver"].cancel()
    await settle()
    figures = q.stats().tenants
    assert figures["b"].waiting == 0
    assert figures["b"].left == 1
    runs.end("running")
    await settle()
    assert runs.granted == ["running", "next"]
    runs.end("next")
    assert q.in_use == 0
    assert q.stats().tenants["c"].slots == 0


async def test_a_slot_granted_as_its_caller_leaves_goes_back() -> None:
    q = queue(slots=1)
    runs = Runs(q)
    runs.start("running", "a")
    runs.start("leaver", "b")
    await settle()
    runs.end("running")  # grants "leaver" its slot: its task has not run yet
    runs.tasks["leaver"].cancel()
    await settle()
    assert runs.tasks["leaver"].cancelled()
    assert q.in_use == 0
    runs.start("after", "a")
    await settle()
    assert runs.granted[-1] == "after"


async def test_a_run_of_several_samples_takes_as_many_slots_and_is_not_passed() -> None:
    q = queue(slots=4)
    runs = Runs(q)
    runs.start("one", "a")
    runs.start("two", "a")
    runs.start("four", "b", cost=4)
    runs.start("small", "c")
    await settle()
    assert runs.granted == ["one", "two"]  # "four" waits for all four; "small" behind it
    runs.end("one")
    await settle()
    assert runs.granted == ["one", "two"]
    runs.end("two")
    await settle()
    assert runs.granted[-1] == "four"
    assert q.in_use == 4
    runs.end("four")
    await settle()
    assert runs.granted[-1] == "small"


async def test_more_samples_than_slots_run_alone() -> None:
    q = queue(slots=2)
    slot = await q.acquire("a", 0, 8)
    assert slot.cost == 2
    assert q.in_use == 2
    q.release(slot)
    assert q.in_use == 0


async def test_without_the_queue_every_run_starts_at_once() -> None:
    q = queue(slots=None)
    slots = [await q.acquire("a", 0, 1) for _ in range(100)]
    assert q.in_use == 100
    assert q.stats().slots == 0
    for slot in slots:
        q.release(slot)
    assert q.stats().tenants["a"].granted == 100


async def test_the_figures_keep_at_most_max_labels_tenants_apart() -> None:
    q = EngineQueue(4, TenantSettings(max_labels=2), Clock())
    for tenant in ("a", "b", "c", "d"):
        q.release(await q.acquire(tenant, 0, 1))
    assert sorted(q.stats().tenants) == ["a", "b", "other"]
    assert q.stats().tenants["other"].granted == 2


async def test_a_tenant_that_ran_alone_owes_nothing_when_another_comes() -> None:
    """Slots nobody else wanted are not a debt: a newcomer shares from where the loner is."""
    q = queue(slots=4, heavy={"weight": 3})
    runs = Runs(q)
    for i in range(40):
        runs.start(f"light{i}", "light")
    await settle()
    for i in range(20):  # light runs alone a while, then goes idle between two requests
        runs.end(f"light{i}")
        await settle()
    for i in range(20, 24):
        runs.end(f"light{i}")
    for task in runs.tasks.values():
        task.cancel()
    await settle()
    runs = Runs(q)
    for i in range(20):
        runs.start(f"heavy{i}", "heavy")
        runs.start(f"light{i}", "light")
    await settle()
    granted: list[str] = []
    for _ in range(16):
        name = next(iter(runs.slots))
        runs.end(name, after=0.25)
        await settle()
        granted.append(runs.granted[-1].rstrip("0123456789"))
    assert 3 <= granted.count("light") <= 5, granted


async def test_a_newcomer_takes_the_next_free_slot_whatever_the_runs_were_charged() -> None:
    """Runs far shorter than the first estimate: their refunds at release must not put the
    tenant that holds every slot back ahead of one that has just come."""
    q = queue(slots=4)
    runs = Runs(q)
    for i in range(24):
        runs.start(f"a{i}", "a")
    await settle()
    runs.start("b", "b")
    await settle()
    runs.end("a0", after=0.2)
    await settle()
    assert runs.granted[-1] == "b", runs.granted


async def test_a_tenant_that_runs_leaves_the_newcomers_slot_free() -> None:
    """The probe's case: A's long runs would hold every slot, and B would wait the length of a
    run. A leaves one slot free; B takes it at once; C, the next newcomer, waits for the first
    slot A's runs free, which the fair order gives it before A."""
    q = queue(slots=4, newcomers=1)
    runs = Runs(q)
    for i in range(8):
        runs.start(f"a{i}", "a")
    await settle()
    assert runs.granted == ["a0", "a1", "a2"]
    assert q.in_use == 3
    runs.start("b", "b")
    await settle()
    assert runs.granted[-1] == "b"
    runs.start("c", "c")
    await settle()
    assert runs.granted[-1] == "b"  # the newcomers' slot is taken: C waits for a run to end
    runs.end("a0")
    await settle()
    assert runs.granted[-1] == "c"
    runs.end("b")  # B ran and left: its slot is the newcomers' again, not A's
    await settle()
    assert q.in_use == 3
    assert runs.granted[-1] == "c"


async def test_a_tenant_alone_leaves_only_the_newcomers_slots_free() -> None:
    q = queue(slots=4, newcomers=2)
    runs = Runs(q)
    for i in range(6):
        runs.start(f"a{i}", "a")
    await settle()
    assert runs.granted == ["a0", "a1"]
    assert queue(slots=1, newcomers=1).reserve == 0  # one slot: it is everybody's


async def test_a_newcomer_needing_more_slots_than_are_kept_waits_as_before() -> None:
    q = queue(slots=4, newcomers=1)
    runs = Runs(q)
    for i in range(4):
        runs.start(f"a{i}", "a")
    await settle()
    runs.start("big", "b", cost=2)
    await settle()
    assert "big" not in runs.granted
    runs.end("a0")
    await settle()
    assert runs.granted[-1] == "big"


async def test_runs_beyond_the_alternatives_wait_and_other_tenants_runs_pass_them() -> None:
    q = queue(slots=8, alternatives=100)
    runs = Runs(q)
    runs.start("lp1", "a", alternatives=84)  # n=4, 20 alternatives
    runs.start("lp2", "a", alternatives=84)
    runs.start("lp3", "b", alternatives=84)
    runs.start("own", "b")  # within a tenant the order stays: behind B's own run
    runs.start("plain", "c")
    await settle()
    assert runs.granted == ["lp1", "plain"]
    assert q.alternatives_in_use == 84
    runs.end("lp1")
    await settle()
    # B's usage is the least: its run goes before A's second, then its own plain one
    assert runs.granted[-2:] == ["lp3", "own"]
    runs.end("lp3")
    await settle()
    assert runs.granted[-1] == "lp2"
    runs.end("lp2")
    assert q.alternatives_in_use == 0
    huge = await q.acquire("a", 0, 1, 10_000)  # beyond the bound alone: it runs alone
    assert q.alternatives_in_use == 10_000
    q.release(huge)


async def test_a_run_that_waited_has_a_queue_span_with_its_wait() -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from services.observability import spans

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    token = spans.CURRENT_TRACER.set(provider.get_tracer("test"))
    try:
        q = queue(slots=1)
        runs = Runs(q)
        runs.start("first", "a")  # a slot free: no wait, no span
        runs.start("second", "b", priority=3)
        await settle()
        runs.end("first", after=0.25)
        await settle()
        runs.end("second")
    finally:
        spans.CURRENT_TRACER.reset(token)
    (span,) = exporter.get_finished_spans()
    assert span.name == "queue"
    assert span.attributes is not None
    assert span.attributes["mmgate.tenant"] == "b"
    assert span.attributes["mmgate.priority"] == 3
    assert span.attributes["mmgate.queue.wait_ms"] == 250.0


async def test_the_load_by_priority_counts_slots_held_and_runs_waiting() -> None:
    q = queue(slots=3)
    runs = Runs(q)
    runs.start("a0", "a", priority=0, cost=2)
    runs.start("b5", "b", priority=5)
    await settle()
    assert q.by_priority() == ((0, 2, 0), (5, 1, 0))
    for name, tenant, priority in (("a-1", "a", -1), ("b5x", "b", 5), ("c5", "c", 5)):
        runs.start(name, tenant, priority)
    await settle()
    assert q.by_priority() == ((-1, 0, 1), (0, 2, 0), (5, 1, 2))
    runs.tasks["c5"].cancel()  # a caller that left is no longer waiting
    await settle()
    assert q.by_priority() == ((-1, 0, 1), (0, 2, 0), (5, 1, 1))
    runs.end("a0")  # its two slots: to a-1, then to b5x
    await settle()
    assert q.by_priority() == ((-1, 1, 0), (5, 2, 0))
    for name in list(runs.slots):
        runs.end(name)
    assert q.by_priority() == ()
