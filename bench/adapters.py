"""What answering through a LoRA adapter costs: tokens per second through a test adapter against
the base model, on one server, alternated; and the base model on a server without adapters.

    server with adapters (MMGATE_ENGINE__ADAPTERS: one test adapter of rank 8 on q_proj and
    v_proj of every layer) ─▶ for each round, each level: base model, then adapter (the order
    swaps every round), a closed loop of greedy streams of 64 tokens each, every prompt new
    server without adapters ─▶ the same levels, base model: what enabling LoRA costs by itself

On a CPU, mmgate sends base-model requests of an engine with adapters through an all-zero
adapter (services/engine/adapters.py), so "base, LoRA on" pays the LoRA kernels too.

    python -m bench.adapters [--rounds 2] [--levels 1 16] [--requests N] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from services.config import Settings
from services.models import build_test_adapter, resolve_model

from .service import (
    DISTURBED,
    ROOT,
    Mmgate,
    closed_loop,
    level_indices,
    requests_for,
    rounds_main,
)

WARMUP = 4


async def level(
    server: Mmgate, side: str, round_: int, concurrency: int, n: int | None
) -> dict[str, Any]:
    server.tag = f"{side}-r{round_}"  # new prompts: no prefix cached from another side
    indices = level_indices(concurrency, requests_for(concurrency, n, loops=3))
    measured = await closed_loop(server.send, concurrency, indices)
    found = {
        "side": side,
        "round": round_,
        "concurrency": concurrency,
        "tokens_per_second": measured.throughput,
        "ttft_p50_ms": measured.ttft_ms(0.5),
        "others": measured.others,
    }
    print(
        f"  {side:<16} round {round_} c={concurrency:<3} {measured.throughput:7.1f} tok/s"
        f"  TTFT p50 {found['ttft_p50_ms']:6.0f} ms"
        + ("  disturbed" if measured.others > DISTURBED else ""),
        flush=True,
    )
    return found


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    model = resolve_model(Settings())
    adapter = build_test_adapter(Path(model), ROOT / "build" / "bench" / "adapter-a1", seed=1)
    rows: list[dict[str, Any]] = []
    served = Mmgate(model, {"MMGATE_ENGINE__ADAPTERS": json.dumps({"a1": str(adapter)})})
    await served.start()
    try:
        served.adapter = "a1"
        await closed_loop(served.send, WARMUP, range(10**7, 10**7 + WARMUP))
        for round_ in range(1, args.rounds + 1):
            for concurrency in args.levels:
                order = ["adapter", "base, LoRA on"]
                for side in order if round_ % 2 else order[::-1]:
                    served.adapter = "a1" if side == "adapter" else ""
                    rows.append(await level(served, side, round_, concurrency, args.requests))
    finally:
        await served.close()
    plain = Mmgate(model)
    await plain.start()
    try:
        await closed_loop(plain.send, WARMUP, range(10**7, 10**7 + WARMUP))
        for round_ in range(1, args.rounds + 1):
            for concurrency in args.levels:
                rows.append(
                    await level(plain, "base, LoRA off", round_, concurrency, args.requests)
                )
    finally:
        await plain.close()
    return report(rows)


def report(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    at = {(r["side"], r["round"], r["concurrency"]): r for r in rows}
    ratios = []
    print("\nratios of tokens per second within a round")
    for (side, round_, concurrency), through in sorted(at.items()):
        if side != "adapter":
            continue
        on = at[("base, LoRA on", round_, concurrency)]
        off = at.get(("base, LoRA off", round_, concurrency))
        found = {
            "round": round_,
            "concurrency": concurrency,
            "adapter_over_base_lora_on": through["tokens_per_second"] / on["tokens_per_second"],
            "adapter_over_base_lora_off": (
                through["tokens_per_second"] / off["tokens_per_second"] if off else None
            ),
            "base_lora_on_over_off": (
                on["tokens_per_second"] / off["tokens_per_second"] if off else None
            ),
        }
        ratios.append(found)
        print(
            f"  round {round_} c={concurrency:<3} adapter / base (LoRA on)"
            f" {found['adapter_over_base_lora_on']:.3f}x"
            + (
                f", adapter / base (LoRA off) {found['adapter_over_base_lora_off']:.3f}x,"
                f" base LoRA on / off {found['base_lora_on_over_off']:.3f}x"
                if off
                else ""
            )
        )
    for concurrency in sorted({r["concurrency"] for r in ratios}):
        values = [r["adapter_over_base_lora_on"] for r in ratios if r["concurrency"] == concurrency]
        print(
            f"  c={concurrency:<3} median adapter / base (LoRA on) {statistics.median(values):.3f}x"
        )
    return {"rows": list(rows), "ratios": ratios}


def main(argv: Sequence[str] | None = None) -> int:
    return rounds_main(__doc__.splitlines()[0], main_async, argv)


if __name__ == "__main__":
    raise SystemExit(main())
