"""Thread pools for CPU-bound work, each kind with a capacity of its own.

    hash ─┐  (image digests)       each pool: CapacityLimiter(its setting) ─ queued callers wait
    decode ┤ (images, clips → RGB)   here, on the event loop, cancellable (waiting_to_start:
    encode ┤ (vision encoder)        a cache flight whose waiters all leave is cancelled before
    render ┘ (chat template)         it starts) ─▶ anyio.to_thread.run_sync ─▶ the thread pool

Encodes may be held to chosen CPUs (``encode_cpus``): the thread running one is pinned for it
and set back after, and the torch threads it starts inherit its CPUs.

With one shared executor (``asyncio.to_thread``) a burst of huge images queued every request's
prompt rendering behind it; here a kind of work can fill only its own pool. A computation that has
started runs to its end (DESIGN: the flight does not belong to the caller who left), but for a
clip's decode, which takes seconds and stops between frames once nobody waits (run_stoppable).
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Literal, TypeVar, final, get_args

import anyio.to_thread
from anyio import CapacityLimiter
from prometheus_client.core import Metric

from cache_actor import waiting_to_start

from ..config import ThreadSettings
from ..observability.metric_families import thread_families
from ..types import ThreadPoolStats

T = TypeVar("T")
Pool = Literal["hash", "decode", "encode", "render"]


@final
class ThreadPools:
    def __init__(self, settings: ThreadSettings) -> None:
        self.limiters: dict[Pool, CapacityLimiter] = {
            pool: CapacityLimiter(getattr(settings, pool)) for pool in get_args(Pool)
        }
        # sizes anyio's thread pool to the sum of the pools: their own limiters are the bound
        self._threads = CapacityLimiter(
            sum(int(lim.total_tokens) for lim in self.limiters.values())
        )
        self._cpus: dict[Pool, frozenset[int]] = {}
        if settings.encode_cpus:
            _check_cpus(settings.encode_cpus)
            self._cpus["encode"] = settings.encode_cpus

    async def run(self, pool: Pool, work: Callable[..., T], *args: object) -> T:
        """``work(*args)`` in a thread once ``pool`` has capacity for it."""
        async with self.capacity(pool):
            return await self.in_thread(pool, work, *args)

    @contextlib.asynccontextmanager
    async def capacity(self, pool: Pool) -> AsyncIterator[None]:
        """One of ``pool``'s threads, held for the block: for work that is chosen only once a
        thread is free (a batch of encodes), run with :meth:`in_thread`."""
        limiter = self.limiters[pool]
        with waiting_to_start():
            await limiter.acquire()
        try:
            yield
        finally:
            limiter.release()

    async def run_stoppable(
        self, pool: Pool, work: Callable[..., T], stop: threading.Event, *args: object
    ) -> T:
        """``work(*args)`` in a thread, as :meth:`run`, for work that checks ``stop`` as it goes:
        cancelled, the caller stops waiting at once and ``stop`` is set, where :meth:`run` waits
        for the thread to end (a clip's decode left running for nobody, for seconds)."""
        async with self.capacity(pool):
            try:
                return await anyio.to_thread.run_sync(
                    work, *args, limiter=self._threads, abandon_on_cancel=True
                )
            except BaseException:
                # cancelled (or failed): the thread, if it still runs, ends at its next check
                stop.set()
                raise

    async def in_thread(self, pool: Pool, work: Callable[..., T], *args: object) -> T:
        """``work(*args)`` in a thread, under ``pool``'s :meth:`capacity` held by the caller."""
        cpus = self._cpus.get(pool)
        if cpus is not None:
            work = functools.partial(_on_cpus, cpus, work)
        return await anyio.to_thread.run_sync(work, *args, limiter=self._threads)

    def stats(self) -> tuple[ThreadPoolStats, ...]:
        out = []
        for pool, limiter in self.limiters.items():
            numbers = limiter.statistics()
            out.append(
                ThreadPoolStats(
                    pool=pool,
                    threads=int(numbers.total_tokens),
                    busy=int(numbers.borrowed_tokens),
                    waiting=numbers.tasks_waiting,
                )
            )
        return tuple(out)

    def collect(self) -> Iterator[Metric]:
        return thread_families(self.stats())


__all__ = ["Pool", "ThreadPools"]


def _check_cpus(cpus: frozenset[int]) -> None:
    """Raises ValueError where this thread cannot be held to ``cpus`` (no such CPU, or none this
    process may use, or no CPU affinity on this system)."""
    if not hasattr(os, "sched_setaffinity"):
        raise ValueError("threads.encode_cpus needs a system with CPU affinity (Linux)")
    try:
        if max(cpus) >= (os.cpu_count() or 0):
            raise OSError
        _on_cpus(cpus, lambda: None)
    except OSError:
        raise ValueError(
            f"threads.encode_cpus: CPUs {sorted(cpus)} are not available to this process"
        ) from None


def _on_cpus(cpus: frozenset[int], work: Callable[..., T], *args: object) -> T:
    """``work(*args)`` with the calling thread held to ``cpus``, then set back."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        return work(*args)
    finally:
        os.sched_setaffinity(0, before)
