"""mmgate's queue in front of the engine: who runs next when every engine slot is taken.

    runner.py ─▶ queue.admit(run, tenant) ─▶ a slot free? ─▶ Slot: the run goes to the engine
                      │                              ▲
                      └▶ waits: within a tenant by   │ queue.release(slot): a run that ends
                         priority then arrival;      │ frees its slots, the next is picked
                         across tenants by weighted  │ (pick())
                         fair queuing ───────────────┘

vLLM runs at most ``max_num_seqs`` sequences at once and keeps the rest in its own queue, first
come first served: there, one tenant's burst holds back everyone who comes after it, and vLLM
frees no running slot for urgent work (it preempts only when KV-cache blocks run out). So mmgate
hands the engine no more sequences than it runs at once (plus ``queue_lead``), a run of n samples
taking n slots, and decides the order here.

Fair shares are of engine time. A tenant's usage is the slot-seconds its runs held, divided by its
weight; a free slot goes to the waiting tenant whose usage is least. A run is charged the recent
mean run length when it starts and its actual length when it ends, so slots freed together are
spread by weight, and long runs cost what they hold. A tenant that was idle comes back at the
least usage among those active: idle time saves up no credit, and a debt is kept. A slot nobody
else waits for goes to whoever waits, beyond any share, but for ``newcomer_slots``: a tenant
that already runs leaves that many free, so that a tenant with nothing running starts at once
(within one engine step) even while another's long runs hold every other slot; vLLM would free
none for it (the fair order above only hands out slots that runs free).

vLLM turns every log-probability alternative into text on the event loop, at every step: a run
of n samples with k alternatives costs n x (k + 1) of them a step. At most
``max_logprob_alternatives`` are in the engine at once; a run beyond that waits (one run alone
always goes), while other tenants' runs that ask for none pass it.

A waiting request keeps its deadline (the caller's timeout cancels the wait) and leaves the queue
when its caller goes; a slot granted as the wait was cancelled is handed back at once.
"""

from __future__ import annotations

import asyncio
import bisect
import heapq
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final, final

from ..config import TenantSettings
from ..observability.queue_metrics import QUEUE_WAIT_BUCKETS, QueueStats, TenantQueueStats
from ..observability.spans import span
from ..types import EngineRequest

# The run length a tenant is charged when its first run starts, before any run has ended (s).
FIRST_ESTIMATE_SECONDS: Final = 1.0
# How much the last run's length moves the estimate (an exponential moving average).
ESTIMATE_WEIGHT: Final = 0.1
# Label for the tenants beyond ``max_labels`` in the queue's figures.
OTHER_TENANTS: Final = "other"


@final
@dataclass(eq=False, slots=True)
class Slot:
    """Engine slots held by one run, from its grant until ``EngineQueue.release``."""

    tenant: str
    cost: int
    alternatives: int  # log-probability alternatives a step
    started: float  # the queue's clock at the grant
    charged: float  # the estimate charged at the grant, slot-seconds
    waited: float  # seconds in the queue
    priority: int = 0


@final
@dataclass(eq=False, slots=True)
class _Waiter:
    tenant: str
    cost: int
    alternatives: int  # log-probability alternatives a step
    arrived: float
    granted: asyncio.Future[Slot]


@final
@dataclass(eq=False, slots=True)
class _Tenant:
    weight: float
    usage: float = 0.0  # slot-seconds charged / weight: the virtual time of fair queuing
    pending: float = 0.0  # of usage, the estimates charged to runs still running
    waiting: list[tuple[int, int, _Waiter]] = field(default_factory=list)  # (priority, order, ..)
    depth: int = 0  # waiters not cancelled
    slots: int = 0

    @property
    def active(self) -> bool:
        return self.depth > 0 or self.slots > 0

    @property
    def settled(self) -> float:
        """Usage of runs that have ended: it only grows (a run's estimate is no part of it)."""
        return self.usage - self.pending

    def head(self) -> _Waiter | None:
        """The most urgent waiter still waiting (cancelled ones are dropped here)."""
        while self.waiting:
            waiter = self.waiting[0][2]
            if not waiter.granted.done():
                return waiter
            heapq.heappop(self.waiting)
        return None


@final
class EngineQueue:
    """The order in which runs reach the engine, by tenant weight and request priority.

    ``slots`` None: no queue (``MMGATE_ENGINE__QUEUE=false``): every run goes to the engine at once,
    and only the figures are kept. ``alternatives``: log-probability alternatives in the engine
    at once, at most (None: any number).
    """

    def __init__(
        self,
        slots: int | None,
        tenants: TenantSettings,
        clock: Callable[[], float] = time.monotonic,
        alternatives: int | None = None,
    ) -> None:
        self.slots = slots
        self.tenants = tenants
        self.clock = clock  # a test's own clock stands in run lengths
        # slots a tenant that runs leaves free for one that does not (one slot at least is theirs)
        self.reserve = min(tenants.newcomer_slots, slots - 1) if slots is not None else 0
        self.alternatives = alternatives if slots is not None else None
        self.in_use = 0
        self.alternatives_in_use = 0
        self._tenants: dict[str, _Tenant] = {}
        self._floor = 0.0  # the virtual time when no tenant is active
        self._estimate = FIRST_ESTIMATE_SECONDS
        self._order = itertools.count()
        self._stats: dict[str, TenantQueueStats] = {}
        self._slots_by_priority: dict[int, int] = {}  # slots held, by the runs' priority

    # ── a run ────────────────────────────────────────────────────────────────────────────────

    async def admit(self, run: EngineRequest, tenant: str) -> Slot:
        """Wait for the slots ``run`` takes, one a sample, and its log-probability alternatives
        (cancellable); whoever runs it hands them back with ``release``."""
        sampling = run.sampling
        alternatives = sampling.n * (sampling.logprobs + 1) if sampling.logprobs is not None else 0
        return await self.acquire(tenant, run.priority, sampling.n, alternatives)

    async def acquire(self, tenant: str, priority: int, cost: int, alternatives: int = 0) -> Slot:
        """Wait for ``cost`` engine slots (and ``alternatives`` log-probability alternatives a
        step) for one of ``tenant``'s runs (cancellable)."""
        if self.slots is not None:
            cost = max(1, min(cost, self.slots))
        state = self._join(tenant)
        arrived = self.clock()
        future = asyncio.get_running_loop().create_future()
        waiter = _Waiter(tenant, cost, alternatives, arrived, future)
        heapq.heappush(state.waiting, (priority, next(self._order), waiter))
        state.depth += 1
        self._figures(tenant).waiting += 1
        self._grant()
        if waiter.granted.done():
            return waiter.granted.result()
        attributes: dict[str, str | int] = {"mmgate.tenant": tenant, "mmgate.priority": priority}
        with span("queue", attributes) as traced:
            try:
                slot = await waiter.granted
            except asyncio.CancelledError:
                self._left(waiter, state)
                raise
            if traced is not None:
                traced.set_attribute("mmgate.queue.wait_ms", slot.waited * 1000)
            return slot

    def release(self, slot: Slot) -> None:
        """The run has ended: its slots go to whoever waits next, its length is charged."""
        state = self._tenants[slot.tenant]
        held = self.clock() - slot.started
        self.in_use -= slot.cost
        remaining = self._slots_by_priority[slot.priority] - slot.cost
        if remaining:
            self._slots_by_priority[slot.priority] = remaining
        else:
            del self._slots_by_priority[slot.priority]
        self.alternatives_in_use -= slot.alternatives
        state.slots -= slot.cost
        self._figures(slot.tenant).slots -= slot.cost
        state.usage += (held * slot.cost - slot.charged) / state.weight
        state.pending -= slot.charged / state.weight
        self._estimate += ESTIMATE_WEIGHT * (held - self._estimate)
        self._leave(slot.tenant, state)
        self._grant()

    # ── the order ────────────────────────────────────────────────────────────────────────────

    def _join(self, tenant: str) -> _Tenant:
        state = self._tenants.get(tenant)
        if state is None:
            weight = self.tenants.scheduling_of(tenant).weight
            state = self._tenants[tenant] = _Tenant(weight, self._now())
        elif not state.active:
            state.usage = max(state.usage, self._now())
        return state

    def _now(self, leaving: _Tenant | None = None) -> float:
        """The virtual time: the least settled usage among active tenants (and ``leaving``, which
        just ceased to be). It moves on with whoever is served, alone or not, and never back:
        slots a tenant took while nobody else waited are no debt when another comes. Settled:
        the estimates charged to running runs are refunded when they end shorter, so a newcomer
        started from them would be behind the very tenant it came to share with."""
        usages = [s.settled for s in self._tenants.values() if s.active or s is leaving]
        if usages:
            self._floor = max(self._floor, min(usages))
        return self._floor

    def _leave(self, tenant: str, state: _Tenant) -> None:
        """After ``state``'s usage changed: move the virtual time on, and forget the tenant
        once idle and owed nothing more than a newcomer would be."""
        now = self._now(state)
        if not state.active and state.usage <= now:
            del self._tenants[tenant]

    def _pick(self) -> tuple[_Tenant, _Waiter] | None:
        """The next run to start: the head of the waiting tenant whose usage is least, unless it
        must leave the newcomers' slots or the alternatives free (then the next tenant's may
        pass it). A head waiting for more slots than are free is passed by nobody (it would
        starve)."""
        ranked = sorted(
            ((state.usage, state.waiting[0][1]), state, head)
            for state in self._tenants.values()
            if state.depth and (head := state.head()) is not None
        )
        for _, state, head in ranked:
            if self.slots is None or not self.in_use:
                return state, head
            free = self.slots - self.in_use - head.cost
            if free < 0:
                return None
            if state.slots and free < self.reserve:
                continue  # the newcomers' slots
            if (
                self.alternatives is not None
                and head.alternatives
                and self.alternatives_in_use
                and self.alternatives_in_use + head.alternatives > self.alternatives
            ):
                continue
            return state, head
        return None

    def _grant(self) -> None:
        while True:
            picked = self._pick()
            if picked is None:
                return
            state, waiter = picked
            priority = heapq.heappop(state.waiting)[0]
            state.depth -= 1
            now = self.clock()
            charged = self._estimate * waiter.cost
            state.usage += charged / state.weight
            state.pending += charged / state.weight
            state.slots += waiter.cost
            self.in_use += waiter.cost
            self.alternatives_in_use += waiter.alternatives
            waited = now - waiter.arrived
            figures = self._figures(waiter.tenant)
            figures.waiting -= 1
            figures.slots += waiter.cost
            figures.granted += 1
            figures.wait_counts[bisect.bisect_left(QUEUE_WAIT_BUCKETS, waited)] += 1
            figures.wait_seconds += waited
            self._now()
            by_priority = self._slots_by_priority
            by_priority[priority] = by_priority.get(priority, 0) + waiter.cost
            slot = Slot(
                waiter.tenant, waiter.cost, waiter.alternatives, now, charged, waited, priority
            )
            waiter.granted.set_result(slot)

    def _left(self, waiter: _Waiter, state: _Tenant) -> None:
        """The caller went (or its deadline passed) while it waited."""
        if waiter.granted.done() and not waiter.granted.cancelled():
            # granted as the cancellation came: the run never starts, its slots go back
            self.release(waiter.granted.result())
            return
        waiter.granted.cancel()
        state.depth -= 1
        figures = self._figures(waiter.tenant)
        figures.waiting -= 1
        figures.left += 1
        self._leave(waiter.tenant, state)
        self._grant()  # a large run at the head may have held back smaller ones

    # ── figures ──────────────────────────────────────────────────────────────────────────────

    def _figures(self, tenant: str) -> TenantQueueStats:
        """The tenant's figures: the first ``max_labels`` tenants apart, the rest together."""
        figures = self._stats.get(tenant)
        if figures is None:
            label = tenant if len(self._stats) < self.tenants.max_labels else OTHER_TENANTS
            figures = self._stats.setdefault(label, TenantQueueStats())
        return figures

    def by_priority(self) -> tuple[tuple[int, int, int], ...]:
        """(priority, slots held, runs waiting) for each priority with either, most urgent
        first: the load report's (GetLoad). Walks the waiting runs: as many as are admitted."""
        waiting: dict[int, int] = {}
        for state in self._tenants.values():
            for priority, _, waiter in state.waiting:
                if not waiter.granted.done():
                    waiting[priority] = waiting.get(priority, 0) + 1
        held = self._slots_by_priority
        return tuple(
            (p, held.get(p, 0), waiting.get(p, 0)) for p in sorted(held.keys() | waiting.keys())
        )

    def stats(self) -> QueueStats:
        """A copy of the figures (the scrape reads it on the event loop)."""
        tenants = {
            name: TenantQueueStats(
                f.waiting, f.slots, f.granted, f.left, list(f.wait_counts), f.wait_seconds
            )
            for name, f in self._stats.items()
        }
        return QueueStats(self.slots or 0, self.in_use, tenants)


__all__ = ["ESTIMATE_WEIGHT", "FIRST_ESTIMATE_SECONDS", "OTHER_TENANTS", "EngineQueue", "Slot"]
