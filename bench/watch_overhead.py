"""What a watcher that never reads costs: Cache.Watch's bounded buffer, measured.

    one mmgate in this process (the tiny LLaVA, embeddings mode, a cache budget small enough
    that every new image evicts): rounds of requests, each with an image not seen before,
    in ABBA order "without" (no watcher) and "with" (a Cache.Watch stream opened and never read)

In each round: time to first token per request (p50), and the actor's loop lag sampled every
5 ms (p99: how late its ticks ran); for "with", the events the store published during the
round (at least --events) and the gap events watchers got (one is the promise).

    python -m bench.watch_overhead [--rounds 3] [--events 1000] [--requests 1000] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc

from services.api.server import MmgateServer
from services.client import MmgateClient, build_request
from services.config import Settings
from services.models import build_tiny_llava, engine_settings
from tests.services.imagegen import png

CONCURRENCY = 8
# a client that reads nothing takes what HTTP/2 flow control lets in; without BDP probing that
# stays a fixed window (64 KiB)
NO_READER = [("grpc.http2.bdp_probe", 0)]
BUFFER = 256  # the watcher's buffer: under the --events published in a round


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def lag_samples(into: list[float], stop: asyncio.Event, every: float = 0.005) -> None:
    """How late the event loop the actor runs on wakes a timer, as the actor's watchdog
    measures its loop lag (cache_actor/_watchdog.py), every few milliseconds."""
    while not stop.is_set():
        started = time.perf_counter()
        await asyncio.sleep(every)
        into.append(time.perf_counter() - started - every)


async def one_round(
    server: MmgateServer,
    client: MmgateClient,
    watcher: MmgateClient,
    seeds: list[int],
    watched: bool,
) -> dict[str, Any]:
    journal = server.cache.journal
    assert journal is not None
    first_sequence, first_gaps = journal.sequence, journal.gaps
    stream = None
    if watched:
        # opened, its first message read (it is live), then never read again: its channel
        # takes no more than a stream window's worth (no BDP probing to widen it), then the
        # server's writes wait and the watcher's buffer fills
        stream = watcher.watch(timeout=600.0)
        while (await anext(stream)).kind != "synced":
            pass
    ttfts: list[float] = []
    lags: list[float] = []
    stop = asyncio.Event()
    sampler = asyncio.ensure_future(lag_samples(lags, stop))
    queue = list(seeds)

    async def caller() -> None:
        while queue:
            seed = queue.pop()
            request = build_request(
                "What is in the picture?", images=[png(seed)], max_tokens=4, temperature=0.0
            )
            started = time.perf_counter()
            async for event in client.generate(request):
                if event.HasField("delta") and event.delta.token_ids:
                    ttfts.append(time.perf_counter() - started)
                    break
            else:
                raise AssertionError("no token")

    began = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(CONCURRENCY)))
    wall = time.perf_counter() - began
    stop.set()
    await sampler
    if stream is not None:
        await stream.aclose()
    return {
        "watched": watched,
        "requests": len(seeds),
        "seconds": round(wall, 2),
        "events": journal.sequence - first_sequence,
        "gaps": journal.gaps - first_gaps,
        "ttft_p50_ms": round(1000 * statistics.median(ttfts), 2),
        "loop_lag_p99_ms": round(1000 * percentile(lags, 0.99), 3),
        "lag_samples": len(lags),
    }


def sides(rounds: int) -> list[bool]:
    """Whether each round is watched: without, with, with, without, ... (ABBA), so that a
    drift of the host over the run (seen: rounds of one kind 31-50 ms apart at p50) weighs on
    both sides alike; plain alternation put every watched round after an unwatched one."""
    return [n % 4 in (1, 2) for n in range(2 * rounds)]


async def main(rounds: int, events: int, requests: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="mmgate-watch-bench-") as scratch:
        model = build_tiny_llava(Path(scratch) / "tiny-llava")
        settings = Settings(
            port=0,
            engine=engine_settings(model),
            media={"mode": "embeddings"},
            metrics={"port": 0},
            # ~60 images: every new one evicts an older one
            # the unread watcher is the point: it outlives every round, never ended as idle
            cache={"max_bytes": 2**20, "watch_buffer": BUFFER, "watch_idle_seconds": 86_400.0},
            max_concurrent_requests=CONCURRENCY * 2,
        )
        server = MmgateServer(settings, model=str(model))
        await server.start()
        results: list[dict[str, Any]] = []
        try:
            target = f"127.0.0.1:{server.port}"
            slow = grpc.aio.insecure_channel(target, options=NO_READER)
            async with (
                MmgateClient(target, timeout=120.0) as client,
                MmgateClient(target, channel=slow) as watcher,
            ):
                # warm-up: the engine's first runs, the encoder's first batch
                await one_round(server, client, watcher, list(range(10_000, 10_040)), False)
                # ~4 events a request (prompt, image, embedding, and the evictions they cause)
                per_round = max(requests, events // 3)
                seed = 20_000
                for with_watcher in sides(rounds):
                    seeds = list(range(seed, seed + per_round))
                    seed += per_round
                    result = await one_round(server, client, watcher, seeds, with_watcher)
                    results.append(result)
                    print(json.dumps(result), flush=True)
        finally:
            with contextlib.suppress(Exception):
                await server.stop(grace=5)
    without = [r for r in results if not r["watched"]]
    watched = [r for r in results if r["watched"]]

    def ratio(name: str) -> float:
        # medians of the rounds: one stall of this 2-vCPU host must not decide it
        with_it: float = statistics.median(r[name] for r in watched)
        without_it: float = statistics.median(r[name] for r in without)
        return round(with_it / max(without_it, 1e-9), 3)

    summary = {
        "ttft_p50_ratio": ratio("ttft_p50_ms"),
        "loop_lag_p99_ratio": ratio("loop_lag_p99_ms"),
        "events_per_watched_round": [r["events"] for r in watched],
        "gaps_per_watched_round": [r["gaps"] for r in watched],
        "rounds": results,
    }
    print(json.dumps({k: v for k, v in summary.items() if k != "rounds"}, indent=1))
    return summary


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each side")
    parser.add_argument("--events", type=int, default=1000, help="events a round at least")
    parser.add_argument("--requests", type=int, default=1000, help="requests a round at least")
    parser.add_argument("--json")
    args = parser.parse_args()
    figures = asyncio.run(main(args.rounds, args.events, args.requests))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1))
