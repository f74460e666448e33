"""Lookup cost of mmgate's cache actor against the alternatives, measured in one run.

    python -m bench.cache_actor [--lookups N] [--repeats R]      (make bench-cache)

Every contender serves the same scenarios on the same event loop; each figure is the best of
``--repeats`` runs, and every row is printed as a ratio to mmgate's actor in that scenario
(ratio = contender's µs per lookup / actor's; above 1 means the contender is slower).

Contenders:
  mmgate       cache_actor.CacheActor
  bare-actor   the floor for this design: one Queue, one Future per caller, a dict, single flight
  rlock-dict   the design mmgate replaces: threading.RLock + dict, called via asyncio.to_thread
  async-lru    async_lru.alru_cache (coalesces concurrent calls in the caller's task)
  aiocache     aiocache.SimpleMemoryCache get/set (no coalescing)
"""

from __future__ import annotations

import argparse
import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiocache import SimpleMemoryCache
from async_lru import alru_cache

from cache_actor import CacheActor, CacheConfig

VALUE = b"x" * 1024
CALLERS = 100


async def compute() -> bytes:
    return VALUE


# ── contenders ──────────────────────────────────────────────────────────────────────────────


class Contender:
    """get(key) for each contender, with the same trivial computation behind a miss."""

    name: str

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        pass

    async def get(self, key: str) -> Any:
        raise NotImplementedError


class Mmgate(Contender):
    name = "mmgate"

    async def start(self) -> None:
        self.cache = CacheActor(CacheConfig(mailbox_size=1_000_000))
        self.cache.start()

    async def close(self) -> None:
        await self.cache.aclose()

    async def get(self, key: str) -> Any:
        return (await self.cache.get(key, compute)).value


class BareActor(Contender):
    """The least an actor with per-key futures and single flight can do."""

    name = "bare-actor"

    async def start(self) -> None:
        self.queue: asyncio.Queue[tuple[str, Any, Any]] = asyncio.Queue()
        self.values: dict[str, bytes] = {}
        self.flights: dict[str, list[asyncio.Future[bytes]]] = {}
        self.task = asyncio.create_task(self.run())

    async def close(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)

    async def run(self) -> None:
        while True:
            key, future, value = await self.queue.get()
            if future is None:  # a completed computation
                self.values[key] = value
                for waiter in self.flights.pop(key):
                    waiter.set_result(value)
            elif key in self.values:
                future.set_result(self.values[key])
            elif key in self.flights:
                self.flights[key].append(future)
            else:
                self.flights[key] = [future]
                asyncio.create_task(self.load(key))  # noqa: RUF006 - the actor owns it

    async def load(self, key: str) -> None:
        self.queue.put_nowait((key, None, await compute()))

    async def get(self, key: str) -> Any:
        future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self.queue.put_nowait((key, future, None))
        return await future


class RLockDict(Contender):
    """A lock-based dict cache with a synchronous miss path, as mmgate's predecessor had."""

    name = "rlock-dict"

    async def start(self) -> None:
        self.lock = threading.RLock()
        self.values: dict[str, bytes] = {}

    def _get(self, key: str) -> bytes:
        with self.lock:
            value = self.values.get(key)
            if value is None:
                value = self.values[key] = VALUE
            return value

    async def get(self, key: str) -> Any:
        return await asyncio.to_thread(self._get, key)


class AsyncLru(Contender):
    name = "async-lru"

    async def start(self) -> None:
        @alru_cache(maxsize=None)
        async def load(key: str) -> bytes:
            return await compute()

        self.load = load

    async def close(self) -> None:
        await self.load.cache_close()

    async def get(self, key: str) -> Any:
        return await self.load(key)


class AioCache(Contender):
    name = "aiocache"

    async def start(self) -> None:
        self.cache = SimpleMemoryCache()

    async def get(self, key: str) -> Any:
        value = await self.cache.get(key)
        if value is None:
            value = await compute()
            await self.cache.set(key, value)
        return value


CONTENDERS: list[type[Contender]] = [Mmgate, BareActor, RLockDict, AsyncLru, AioCache]


# ── scenarios ───────────────────────────────────────────────────────────────────────────────


async def hits_one_caller(c: Contender, n: int) -> None:
    await c.get("hot")
    for _ in range(n):
        await c.get("hot")


async def hits_many_callers(c: Contender, n: int) -> None:
    await c.get("hot")

    async def caller() -> None:
        for _ in range(n // CALLERS):
            await c.get("hot")

    await asyncio.gather(*(caller() for _ in range(CALLERS)))


async def misses_one_caller(c: Contender, n: int) -> None:
    for i in range(n):
        await c.get(f"miss-{i}")


async def misses_many_callers(c: Contender, n: int) -> None:
    async def caller(offset: int) -> None:
        for i in range(n // CALLERS):
            await c.get(f"miss-{offset}-{i}")

    await asyncio.gather(*(caller(j) for j in range(CALLERS)))


async def coalesced(c: Contender, n: int) -> None:
    # bursts of CALLERS concurrent lookups of one new key: 1 miss and 99 joins each
    for burst in range(n // CALLERS):
        key = f"burst-{burst}"
        await asyncio.gather(*(c.get(key) for _ in range(CALLERS)))


@dataclass(frozen=True)
class Scenario:
    name: str
    run: Callable[[Contender, int], Awaitable[None]]
    # lookups it makes for n (the hit scenarios add one warm-up lookup, not counted)
    lookups: Callable[[int], int]


SCENARIOS = [
    Scenario("hit, 1 caller", hits_one_caller, lambda n: n),
    Scenario(f"hit, {CALLERS} callers", hits_many_callers, lambda n: n // CALLERS * CALLERS),
    Scenario("miss, 1 caller", misses_one_caller, lambda n: n),
    Scenario(f"miss, {CALLERS} callers", misses_many_callers, lambda n: n // CALLERS * CALLERS),
    Scenario(f"coalesced, bursts of {CALLERS}", coalesced, lambda n: n // CALLERS * CALLERS),
]


async def measure(contender: type[Contender], scenario: Scenario, n: int, repeats: int) -> float:
    """Best µs per lookup over ``repeats`` fresh caches."""
    best = float("inf")
    for _ in range(repeats):
        c = contender()
        await c.start()
        started = time.perf_counter()
        await scenario.run(c, n)
        elapsed = time.perf_counter() - started
        await c.close()
        best = min(best, elapsed / scenario.lookups(n) * 1e6)
    return best


async def main(n: int, repeats: int) -> dict[str, dict[str, float]]:
    results: dict[str, dict[str, float]] = {}
    for scenario in SCENARIOS:
        row = results[scenario.name] = {}
        for contender in CONTENDERS:
            # the thread hop costs ~100x more per lookup: fewer lookups keep the run short
            lookups = n // 10 if contender is RLockDict else n
            row[contender.name] = await measure(contender, scenario, lookups, repeats)
    return results


def report(results: dict[str, dict[str, float]]) -> None:
    names = [c.name for c in CONTENDERS]
    print(f"{'scenario':<26}" + "".join(f"{name:>22}" for name in names))
    print(f"{'':<26}" + "".join(f"{'µs/lookup (ratio)':>22}" for _ in names))
    for scenario, row in results.items():
        base = row["mmgate"]
        cells = "".join(f"{row[n]:>12.2f} ({row[n] / base:>5.2f}x)" for n in names)
        print(f"{scenario:<26}{cells}")
    print()
    print(f"{'scenario':<26}" + "".join(f"{name:>22}" for name in names))
    print(f"{'':<26}" + "".join(f"{'lookups/s':>22}" for _ in names))
    for scenario, row in results.items():
        print(f"{scenario:<26}" + "".join(f"{1e6 / row[n]:>22,.0f}" for n in names))
    print()
    hit1, hit100 = results["hit, 1 caller"], results[f"hit, {CALLERS} callers"]
    goals = [
        (
            "hit path costs at most 1.3x the bare actor",
            hit1["mmgate"] / hit1["bare-actor"],
            hit1["mmgate"] / hit1["bare-actor"] <= 1.3,
        ),
        (
            "hit path faster than aiocache",
            hit1["aiocache"] / hit1["mmgate"],
            hit1["mmgate"] < hit1["aiocache"],
        ),
        (
            f"{CALLERS} callers: at least 0.7x the bare actor's throughput",
            hit100["bare-actor"] / hit100["mmgate"],
            hit100["bare-actor"] / hit100["mmgate"] >= 0.7,
        ),
    ]
    for goal, ratio, met in goals:
        print(f"goal: {goal:<60} {ratio:5.2f}x  {'met' if met else 'NOT MET'}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lookups", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    report(asyncio.run(main(args.lookups, args.repeats)))
