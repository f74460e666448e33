"""What mmgate's queue in front of the engine costs: tokens per second with it against without it
(MMGATE_ENGINE__QUEUE=false), one tenant, alternated.

    each round, each side (the order swaps every round): a fresh server on the default model
    (max_num_seqs 32), warmed up, then a closed loop of greedy streams of 64 tokens each, every
    prompt new, at each concurrency level (64: twice what the engine runs, so that half the
    requests wait: in mmgate's queue with it, in the engine's without)

    python -m bench.fair_queue [--rounds 2] [--levels 64] [--requests N] [--json FILE]
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Sequence
from typing import Any

from services.config import Settings
from services.models import resolve_model

from .adapters import level
from .service import Mmgate, closed_loop, rounds_main

WARMUP = 4
SIDES = {"queue": "true", "no queue": "false"}


async def side_round(
    model: str, side: str, round_: int, levels: Sequence[int], n: int | None
) -> list[dict[str, Any]]:
    server = Mmgate(model, {"MMGATE_ENGINE__QUEUE": SIDES[side]})
    await server.start()
    rows = []
    try:
        await closed_loop(server.send, WARMUP, range(10**7, 10**7 + WARMUP))
        for concurrency in levels:
            rows.append(await level(server, side, round_, concurrency, n))
    finally:
        await server.close()
    return rows


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    model = resolve_model(Settings())
    levels = args.levels if args.levels != [1, 16] else [64]  # rounds_main's default levels
    rows: list[dict[str, Any]] = []
    for round_ in range(1, args.rounds + 1):
        order = list(SIDES)
        for side in order if round_ % 2 else order[::-1]:
            rows += await side_round(model, side, round_, levels, args.requests)
    return report(rows)


def report(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    at = {(r["side"], r["round"], r["concurrency"]): r for r in rows}
    ratios = []
    print("\nratios of tokens per second within a round, with the queue / without")
    for (side, round_, concurrency), with_queue in sorted(at.items()):
        if side != "queue":
            continue
        without = at[("no queue", round_, concurrency)]
        ratio = with_queue["tokens_per_second"] / without["tokens_per_second"]
        ratios.append({"round": round_, "concurrency": concurrency, "queue_over_none": ratio})
        print(f"  round {round_} c={concurrency:<3} {ratio:.3f}x")
    for concurrency in sorted({r["concurrency"] for r in ratios}):
        values = [r["queue_over_none"] for r in ratios if r["concurrency"] == concurrency]
        print(f"  c={concurrency:<3} median {statistics.median(values):.3f}x")
    return {"rows": list(rows), "ratios": ratios}


def main(argv: Sequence[str] | None = None) -> int:
    return rounds_main(__doc__.splitlines()[0], main_async, argv)


if __name__ == "__main__":
    raise SystemExit(main())
