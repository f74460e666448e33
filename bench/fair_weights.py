"""Weights 3 and 1 over a run, tenants that keep asking: the engine slots each is granted.

    one server on the tiny test model, max_num_seqs 4, tenants "heavy" (weight 3) and "light"
    (weight 1), each with --callers callers that send their next request as soon as they have
    their answer; the server's own figures are scraped every --every seconds for --seconds

The ratio that the weights promise holds where both tenants wait for slots: the grants between
two scrapes at which both had requests in mmgate's queue, the second scrape on time, are counted
("steady"). Between other scrapes a tenant's queue may have run dry (its runs too short for the
engine to be the bottleneck, or its callers slow to ask again: a late scrape means this process
stalled, and its callers with it), and the queue, which is work-conserving, gave the slot to
whoever asked: those grants are counted apart ("otherwise").

    python -m bench.fair_weights [--callers 24] [--tokens 960] [--seconds 150] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from services.client import MmgateClient
from services.models import build_tiny_model
from tests.services.prom import Scrape, scrape
from tests.support import start_server

TENANTS = ("heavy", "light")


def figures(found: Scrape) -> dict[str, Any]:
    """One scrape: each tenant's grants so far and its requests waiting."""
    return {
        "at": time.monotonic(),
        "granted": {t: found.value("mmgate_queue_wait_seconds_count", tenant=t) for t in TENANTS},
        "waiting": {t: found.value("mmgate_queue_depth", tenant=t) for t in TENANTS},
    }


def report(samples: Sequence[dict[str, Any]], every: float = 3.0) -> dict[str, Any]:
    """Grants between consecutive scrapes: "steady" where both tenants waited at both ends and
    the scrape came on time (a late scrape means this process stalled, and its callers with it,
    so a tenant's queue may have run dry in between), "otherwise" the rest."""
    counts: dict[str, dict[str, float]] = {
        "steady": dict.fromkeys(TENANTS, 0.0),
        "otherwise": dict.fromkeys(TENANTS, 0.0),
    }
    for before, after in itertools.pairwise(samples):
        waited = all(s["waiting"][t] > 0 for s in (before, after) for t in TENANTS)
        on_time = after["at"] - before["at"] <= 2 * every
        into = counts["steady" if waited and on_time else "otherwise"]
        for t in TENANTS:
            into[t] += after["granted"][t] - before["granted"][t]
    result: dict[str, Any] = dict(counts)
    for name, found in counts.items():
        ratio = found["heavy"] / found["light"] if found["light"] else None
        result[f"{name}_ratio"] = ratio
        shown = "-" if ratio is None else f"{ratio:.2f}:1"
        print(f"  {name}: heavy {found['heavy']:.0f}, light {found['light']:.0f} ({shown})")
    return result


async def keep_asking(client: MmgateClient, tokens: int, refused: list[str]) -> None:
    while True:
        try:
            await client.complete("Tell me a story", max_tokens=tokens, ignore_eos=True)
        except Exception as exc:  # noqa: BLE001 - counted, then the caller asks again
            refused.append(str(exc)[:200])


async def run(args: argparse.Namespace) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="mmgate-fair-weights-"))
    server = start_server(
        root,
        str(build_tiny_model(root / "tiny")),
        MMGATE_ENGINE__MAX_NUM_SEQS="4",
        MMGATE_TENANTS__NEWCOMER_SLOTS="0",  # the fair order alone: every slot to whoever waits
        MMGATE_MAX_CONCURRENT_REQUESTS=str(4 * args.callers),
        # exactly the callers: one waiting for its answer is never refused for it
        MMGATE_TENANTS__MAX_CONCURRENT_REQUESTS=str(args.callers),
        MMGATE_TENANTS__SCHEDULING=json.dumps({"heavy": {"weight": 3}}),
    )
    refused: list[str] = []
    samples: list[dict[str, Any]] = []
    try:
        async with contextlib.AsyncExitStack() as stack:
            clients = [
                await stack.enter_async_context(server.client(tenant=t, timeout=600))
                for t in TENANTS
            ]
            callers = [
                asyncio.ensure_future(keep_asking(client, args.tokens, refused))
                for _ in range(args.callers)
                for client in clients
            ]
            ends = time.monotonic() + args.seconds
            while time.monotonic() < ends:
                await asyncio.sleep(args.every)
                samples.append(figures(await scrape(server.metrics_url)))
                last = samples[-1]
                print(f"  {last['granted']} granted, waiting {last['waiting']}", flush=True)
            for caller in callers:
                caller.cancel()
            await asyncio.gather(*callers, return_exceptions=True)
    finally:
        server.stop()
    print(
        f"\n{args.callers} callers a tenant, {args.tokens}-token runs, {len(refused)} calls failed"
    )
    return {"samples": samples, "failed": refused, **report(samples, args.every)}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--callers", type=int, default=24)
    parser.add_argument("--tokens", type=int, default=960)
    parser.add_argument("--seconds", type=float, default=150.0)
    parser.add_argument("--every", type=float, default=3.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    result = asyncio.run(run(args))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))
    return 0 if not result["failed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
