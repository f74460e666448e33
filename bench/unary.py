"""What a unary call costs the server: mmgate's Complete asking the engine for every step's output
(as a stream does) against asking for the final output only, with vLLM's OpenAI server answering
unstreamed chat completions beside them; the same engine arguments, one server at a time.

    for each round, each side (the order rotates):
        start the server ─▶ warm-up requests ─▶ for each concurrency level: a closed loop of
        greedy requests, 64 tokens each (ignore_eos), every prompt new ─▶ stop

Sides:
  mmgate every step   ``mmgate serve`` with MMGATE_ENGINE__UNARY_FINAL_ONLY=false: Complete
                      consumes an output per engine step (DELTA), as before
  mmgate final only   the default: Complete's own run asks vLLM for FINAL_ONLY outputs
  vllm serve          vLLM's OpenAI server, POST /v1/chat/completions with stream false

Per side and level: output tokens per second, latency p50, and the CPU milliseconds per request
of the server's main process (its engine core, a process of its own on every side, is left out:
the engine's work is the same on all sides) and of this process (the client). Ratios are taken
within a round: final only / every step, and mmgate final only / vLLM's server.

    python -m bench.unary [--rounds 2] [--levels 1 16] [--requests N] [--json FILE]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from services.config import Settings
from services.models import resolve_model

from .openai_server import OpenAIServer
from .service import (
    DISTURBED,
    ENV,
    MAX_TOKENS,
    Level,
    Mmgate,
    Sample,
    closed_loop,
    level_indices,
    process_cpu_seconds,
    prompt_text,
    requests_for,
    rounds_main,
)

WARMUP = 4


class Side(Protocol):
    tag: str

    @property
    def name(self) -> str: ...

    async def start(self) -> float: ...
    async def send(self, i: int) -> Sample: ...
    def cpu_seconds(self) -> dict[str, float]: ...
    async def close(self) -> int | None: ...


class MmgateUnary(Mmgate):
    """``mmgate serve``, asked with Complete; ``final_only`` sets how Complete asks the engine."""

    def __init__(self, model: str, *, final_only: bool) -> None:
        super().__init__(model, {"MMGATE_ENGINE__UNARY_FINAL_ONLY": str(final_only).lower()})
        self.final_only = final_only  # the requests: Mmgate's, cache policy bypass

    @property
    def name(self) -> str:
        return "mmgate final only" if self.final_only else "mmgate every step"

    async def send(self, i: int) -> Sample:
        started = time.perf_counter()
        request = self.request(i)
        answer = await self.client.complete_request(request)
        took = time.perf_counter() - started
        return Sample(took, tuple(answer.token_ids), took, None, request.ByteSize())


class VllmUnary:
    """vLLM's OpenAI server, asked for whole chat completions."""

    name = "vllm serve"

    def __init__(self, model: str) -> None:
        self.server = OpenAIServer(Settings().engine, model)
        self.tag = "a"

    async def start(self) -> float:
        return await self.server.start(ENV)

    async def send(self, i: int) -> Sample:
        started = time.perf_counter()
        body = {
            "model": self.server.model_name,
            "messages": [{"role": "user", "content": prompt_text(i, self.tag)}],
            "max_tokens": MAX_TOKENS,
            "temperature": 0.0,
            "ignore_eos": True,
            "return_token_ids": True,
        }
        answer = await self.server.post("/v1/chat/completions", body)
        took = time.perf_counter() - started
        return Sample(took, tuple(answer["choices"][0]["token_ids"]), took)

    def cpu_seconds(self) -> dict[str, float]:
        return {"client": time.process_time(), "server": process_cpu_seconds(self.server.pid)}

    async def close(self) -> int | None:
        return await self.server.close()


@dataclass
class Row:
    side: str
    round: int
    concurrency: int
    tokens_per_second: float
    latency_p50_ms: float
    server_cpu_ms: float  # per request
    client_cpu_ms: float
    # the machine's CPU taken by other processes meanwhile (above DISTURBED: flagged)
    others: float


def row(side: str, round_: int, level: Level) -> Row:
    cpu = level.cpu_ms_per_request()
    latencies = [s.e2e * 1000 for s in level.samples.values()]
    return Row(
        side,
        round_,
        level.concurrency,
        level.throughput,
        statistics.median(latencies),
        cpu["server"],
        cpu["client"],
        level.others,
    )


async def run_side(
    side: Side, round_: int, levels: Sequence[int], requests: int | None
) -> list[Row]:
    side.tag = f"r{round_}"  # new prompts every round: no prefix cached from the last
    await side.start()
    try:
        await closed_loop(side.send, WARMUP, range(10**7, 10**7 + WARMUP))
        rows = []
        for concurrency in levels:
            indices = level_indices(concurrency, requests_for(concurrency, requests, loops=3))
            level = await closed_loop(side.send, concurrency, indices, side.cpu_seconds)
            rows.append(row(side.name, round_, level))
            print(
                f"  {side.name:<18} round {round_} c={concurrency:<3}"
                f" {rows[-1].tokens_per_second:7.1f} tok/s"
                f"  server {rows[-1].server_cpu_ms:6.1f} ms CPU/request",
                flush=True,
            )
        return rows
    finally:
        await side.close()


def report(rows: Sequence[Row]) -> dict[str, Any]:
    print(
        f"\n{'side':<18} {'round':>5} {'c':>3} {'tok/s':>8} {'p50 ms':>8}"
        f" {'server CPU ms/req':>18} {'client CPU ms/req':>18}"
    )
    for r in rows:
        print(
            f"{r.side:<18} {r.round:>5} {r.concurrency:>3} {r.tokens_per_second:>8.1f}"
            f" {r.latency_p50_ms:>8.0f} {r.server_cpu_ms:>18.1f} {r.client_cpu_ms:>18.1f}"
            + ("  disturbed" if r.others > DISTURBED else "")
        )
    at = {(r.side, r.round, r.concurrency): r for r in rows}
    ratios: list[dict[str, Any]] = []
    print("\nratios within a round (server CPU per request; tokens per second)")
    for (side, round_, concurrency), final in sorted(at.items()):
        if side != "mmgate final only":
            continue
        before = at.get(("mmgate every step", round_, concurrency))
        vllm = at.get(("vllm serve", round_, concurrency))
        if before is None or vllm is None:
            continue
        found = {
            "round": round_,
            "concurrency": concurrency,
            "cpu_final_over_every_step": final.server_cpu_ms / before.server_cpu_ms,
            "cpu_final_over_vllm": final.server_cpu_ms / vllm.server_cpu_ms,
            "cpu_every_step_over_vllm": before.server_cpu_ms / vllm.server_cpu_ms,
            "tps_final_over_every_step": final.tokens_per_second / before.tokens_per_second,
            "tps_final_over_vllm": final.tokens_per_second / vllm.tokens_per_second,
        }
        ratios.append(found)
        print(
            f"  round {round_} c={concurrency:<3} CPU: final/every step"
            f" {found['cpu_final_over_every_step']:.2f}x, final/vLLM"
            f" {found['cpu_final_over_vllm']:.2f}x, every step/vLLM"
            f" {found['cpu_every_step_over_vllm']:.2f}x;  tok/s: final/every step"
            f" {found['tps_final_over_every_step']:.3f}x, final/vLLM"
            f" {found['tps_final_over_vllm']:.3f}x"
        )
    return {"rows": [r.__dict__ for r in rows], "ratios": ratios}


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    model = resolve_model(Settings())
    rows: list[Row] = []
    for round_ in range(1, args.rounds + 1):
        sides: list[Side] = [
            MmgateUnary(model, final_only=False),
            MmgateUnary(model, final_only=True),
            VllmUnary(model),
        ]
        shift = (round_ - 1) % len(sides)  # each side first once in three rounds
        for side in sides[shift:] + sides[:shift]:
            rows += await run_side(side, round_, args.levels, args.requests)
    return report(rows)


def main(argv: Sequence[str] | None = None) -> int:
    return rounds_main(__doc__.splitlines()[0], main_async, argv)


if __name__ == "__main__":
    raise SystemExit(main())
