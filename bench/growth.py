"""How the cache actor's cost grows with its contents, measured in one run.

    python -m bench.growth [--sizes 1000 10000 100000] [--lookups N] [--outputs 1000]

For each size N: a fresh ``CacheActor`` filled with N entries (1 KiB values, a budget that holds
them all), then ``--lookups`` hits on random keys among them (one caller) and as many misses on
new keys; printed: µs per hit and per miss, and the ratio to the smallest size's (growth: 1.00x
means no growth), and the memory per entry the actor keeps beside the value itself (tracemalloc's
traced bytes after filling, minus the values' and the keys' own bytes, per entry).

RSS per 1,000 cached encoder outputs: ``--outputs`` tensors of the shape an encoder output has
(the tiny LLaVA's 16x128 float32, and LLaVA-1.5-7B's 576x4096 bfloat16 when ``--large``), stored
through the actor; printed: the process's RSS growth against the tensors' payload bytes.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import random
import resource
import time
import tracemalloc
from pathlib import Path
from typing import Any

from cache_actor import CacheActor, CacheConfig

VALUE = b"x" * 1024


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def key(i: int) -> str:
    return f"{i:064x}"  # the shape of mmgate's keys: SHA-256 hex digests


async def one_size(size: int, lookups: int) -> dict[str, float]:
    config = CacheConfig(max_bytes=(size + lookups) * 4096 + 2**20, max_flights=1_000_000)
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    async with CacheActor(config) as cache:
        # each its own object, as real values are (bytes(VALUE) would be VALUE itself)
        values = [bytes(bytearray(VALUE)) for _ in range(size)]

        for i in range(size):
            value = values[i]

            async def compute(value: bytes = value) -> bytes:
                return value

            await cache.get(key(i), compute)
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        # what a dict of key -> value would hold anyway: the values and the keys
        own = size * (len(VALUE) + 33) + sum(len(key(i)) + 49 for i in range(size))
        per_entry = (after - before - own) / size
        rng = random.Random(size)
        picks = [key(rng.randrange(size)) for _ in range(lookups)]

        async def hit_value() -> bytes:
            raise AssertionError("a hit computed")

        started = time.perf_counter()
        for k in picks:
            await cache.get(k, hit_value)
        hit_us = (time.perf_counter() - started) / lookups * 1e6

        async def miss_value() -> bytes:
            return VALUE

        started = time.perf_counter()
        for i in range(lookups):
            await cache.get(key(size + 1 + i), miss_value)
        miss_us = (time.perf_counter() - started) / lookups * 1e6
        del values
    return {"hit_us": hit_us, "miss_us": miss_us, "bytes_per_entry": per_entry}


async def encoder_outputs(count: int, shape: tuple[int, ...], dtype: Any) -> dict[str, float]:
    import torch

    payload = int(torch.empty(shape, dtype=dtype).nbytes) * count
    config = CacheConfig(max_bytes=payload * 2 + 2**20)
    gc.collect()
    before = rss_bytes()
    async with CacheActor(config) as cache:
        for i in range(count):

            async def compute() -> Any:
                return torch.randn(shape).to(dtype)

            await cache.get(key(i), compute)
        gc.collect()
        grown = rss_bytes() - before
    return {"payload_bytes": payload, "rss_growth_bytes": grown, "ratio": grown / payload}


async def main(args: argparse.Namespace) -> None:
    import torch

    print(f"cache actor with N entries of {len(VALUE)} B: {args.lookups} lookups each")
    print(f"{'N':>8} {'hit µs':>8} {'growth':>8} {'miss µs':>8} {'growth':>8} {'B/entry':>9}")
    base: dict[str, float] | None = None
    for size in args.sizes:
        row = await one_size(size, args.lookups)
        base = base or row
        print(
            f"{size:>8} {row['hit_us']:>8.2f} {row['hit_us'] / base['hit_us']:>7.2f}x "
            f"{row['miss_us']:>8.2f} {row['miss_us'] / base['miss_us']:>7.2f}x "
            f"{row['bytes_per_entry']:>9.0f}"
        )
    shapes = [("tiny LLaVA (16x128 float32)", (16, 128), torch.float32)]
    if args.large:
        shapes.append(("LLaVA-1.5-7B (576x4096 bfloat16)", (576, 4096), torch.bfloat16))
    print(f"\nRSS per {args.outputs} cached encoder outputs")
    for name, shape, dtype in shapes:
        out = await encoder_outputs(args.outputs, shape, dtype)
        print(
            f"  {name:<34} payload {out['payload_bytes'] / 2**20:9.1f} MiB, RSS grew "
            f"{out['rss_growth_bytes'] / 2**20:9.1f} MiB ({out['ratio']:.2f}x the payload)"
        )


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    parser.add_argument("--lookups", type=int, default=20_000)
    parser.add_argument("--outputs", type=int, default=1_000)
    parser.add_argument("--large", action="store_true", help="also 7B-sized outputs (4.5 GB)")
    return parser.parse_args()


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
