"""Fault injection for reliability runs: off unless ``MMGATE_CHAOS__ENABLED=true``, loud when on.

    Settings.chaos ─▶ injector(settings) ─▶ NoChaos   every hook returns at once (the default)
                                         └▶ Chaos     one seeded draw per operation, from the
                                                      plan of the caller's tenant
    decode, encode   inside the cache flight, before its thread (media/stages.py): a failed
                     flight is not stored; a stalled one meets the compute deadline and the
                     actor's stall detector
    engine           around the engine stream (runner.py), once the run has its slots: "fail"
                     ends it after its first delta, as a dying engine does; "stall" and "slow"
                     hold it before the engine sees the request
    loop_block       at a request's start, on the event loop itself (time.sleep)
    actor            at a request's start, once, after a number of requests: the cache actor
                     killed (its loop crashes) or stalled (its loop takes no message a while)

    fail ─▶ InjectedFault (UNAVAILABLE, reason INJECTED_FAULT)
    stall ─▶ waits until cancelled (the caller's deadline, the compute deadline, shutdown)
    slow ─▶ goes on chaos.slow_seconds late

The settings refuse fault rates without ``enabled``; the server logs a warning at start, every
injected fault is logged and counted (``mmgate_chaos_faults_total``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import Counter
from collections.abc import AsyncGenerator, Iterator
from typing import Literal, TypeVar, final

from prometheus_client.core import Metric

from ..config import ChaosSettings, Faults
from ..errors import InjectedFault
from ..observability.metric_families import chaos_families
from .cache_front import CacheFront

log = logging.getLogger("mmgate.chaos")

Point = Literal["decode", "encode", "engine"]
Fault = Literal["fail", "stall", "slow"]
T = TypeVar("T")


class NoChaos:
    """Nothing injected: what every server runs unless chaos is enabled."""

    enabled = False

    def __init__(self) -> None:
        # (point, fault) ─▶ times injected; "loop_block" is a point of its own
        self.injected: Counter[tuple[str, str]] = Counter()

    async def inject(self, point: Point, tenant: str) -> None:
        """Before an operation at ``point``: fail, stall or delay it, as drawn."""

    def engine(self, stream: AsyncGenerator[T, None], tenant: str) -> AsyncGenerator[T, None]:
        """The engine's stream as this request's draw leaves it."""
        return stream

    def at_request(self, tenant: str, cache: CacheFront) -> None:
        """At a request's start, on the event loop, before its first lookup in ``cache``."""

    def collect(self) -> Iterator[Metric]:
        return chaos_families(self.enabled, self.injected)


@final
class Chaos(NoChaos):
    enabled = True

    def __init__(self, settings: ChaosSettings) -> None:
        super().__init__()
        self.settings = settings
        self.rng = random.Random(settings.seed)
        self.requests = 0  # started, for the actor's faults

    def _draw(self, point: Point, tenant: str) -> Fault | None:
        faults: Faults = getattr(self.settings.plan(tenant), point)
        if not faults.any:
            return None
        shares: tuple[tuple[Fault, float], ...] = (
            ("fail", faults.fail),
            ("stall", faults.stall),
            ("slow", faults.slow),
        )
        roll = self.rng.random()
        for fault, share in shares:
            if roll < share:
                self._count(point, fault, tenant)
                return fault
            roll -= share
        return None

    def _count(self, point: str, fault: str, tenant: str) -> None:
        self.injected[point, fault] += 1
        log.info("chaos: injected %s %s (tenant %s)", point, fault, tenant)

    async def _hold(self, fault: Fault) -> None:
        if fault == "stall":
            await asyncio.Event().wait()  # only a cancellation ends it
        elif fault == "slow":
            await asyncio.sleep(self.settings.slow_seconds)

    async def inject(self, point: Point, tenant: str) -> None:
        fault = self._draw(point, tenant)
        if fault == "fail":
            raise InjectedFault(point)
        if fault is not None:
            await self._hold(fault)

    def engine(self, stream: AsyncGenerator[T, None], tenant: str) -> AsyncGenerator[T, None]:
        fault = self._draw("engine", tenant)
        return stream if fault is None else self._faulty(stream, fault)

    async def _faulty(
        self, stream: AsyncGenerator[T, None], fault: Fault
    ) -> AsyncGenerator[T, None]:
        async with contextlib.aclosing(stream) as deltas:
            await self._hold(fault)
            async for delta in deltas:
                yield delta
                if fault == "fail":
                    # leaving the stream aborts the engine request, as for any early end
                    raise InjectedFault("engine")

    def at_request(self, tenant: str, cache: CacheFront) -> None:
        share = self.settings.plan(tenant).loop_block
        if share and self.rng.random() < share:
            self._count("loop_block", "block", tenant)
            _block_the_event_loop(self.settings.block_seconds)
        started, self.requests = self.requests, self.requests + 1
        if started == self.settings.actor_kill_after:
            self._count("actor", "kill", tenant)
            cache.inject_fault("crash")
        if started == self.settings.actor_stall_after:
            self._count("actor", "stall", tenant)
            cache.inject_fault("stall", self.settings.actor_stall_seconds)


def _block_the_event_loop(seconds: float) -> None:
    time.sleep(seconds)  # what CPU-bound work on the loop does to every other request


def injector(settings: ChaosSettings) -> NoChaos:
    """The variant for these settings, chosen once; a loud warning when faults will be injected."""
    if not settings.enabled:
        return NoChaos()
    log.warning(
        "CHAOS: fault injection is ON (MMGATE_CHAOS__ENABLED): requests will fail, stall and "
        "slow down on purpose; never serve real callers with it (%s)",
        settings.model_dump(exclude={"enabled"}),
    )
    return Chaos(settings)


__all__ = ["Chaos", "NoChaos", "Point", "injector"]
