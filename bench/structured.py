"""Constrained output side by side: mmgate against vLLM's OpenAI server, the same JSON schema and
the same requests, on the same engine arguments (structured-output backend and compact JSON
included), one server at a time.

    for each round, each side (the order alternates):
        start the server ─▶ 1 request with a schema it has never seen (its grammar compiled)
                         ─▶ N requests with that schema (compiled, kept) ─▶ stop

The first request's extra cost over the compiled ones' median is the compile cost on each side;
the compiled requests' median latency gives the ratio. Each answer is parsed and validated
against the schema. Greedy, whole answers (mmgate's Complete, vLLM's chat completion unstreamed).

    python -m bench.structured [--requests 20] [--rounds 4] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import jsonschema

from services.client import MmgateClient
from services.config import Settings
from services.models import resolve_model

from .openai_server import OpenAIServer
from .service import ENV, Mmgate

MAX_TOKENS = 100
Ask = Callable[[str, dict[str, Any]], Awaitable[str]]


def schema(tag: str) -> dict[str, Any]:
    """A record whose every instance fits in MAX_TOKENS; ``tag`` makes its grammar a new one."""
    bounded = {"type": "string", "pattern": "^[A-Za-z ]{1,20}$"}
    return {
        "type": "object",
        "properties": {
            f"city_{tag}": bounded,
            f"country_{tag}": bounded,
            "population_millions": {"type": "integer", "minimum": 0, "maximum": 50},
        },
        "required": [f"city_{tag}", f"country_{tag}", "population_millions"],
    }


def question(i: int) -> str:
    return f"Name a large city (number {i}) with its country and population, as JSON."


@dataclass
class Side:
    name: str
    round: int
    first_s: float
    compiled_s: list[float]
    valid: int
    texts: list[str]

    @property
    def compiled_p50(self) -> float:
        return statistics.median(self.compiled_s)

    @property
    def compile_s(self) -> float:
        return self.first_s - self.compiled_p50


async def measure(name: str, round_: int, ask: Ask, requests: int, tag: str) -> Side:
    record = schema(tag)
    texts, times = [], []
    for i in range(requests + 1):
        started = time.perf_counter()
        texts.append(await ask(question(i), record))
        times.append(time.perf_counter() - started)
    valid = 0
    for text in texts:
        try:
            jsonschema.validate(json.loads(text), record)
            valid += 1
        except (ValueError, jsonschema.ValidationError):
            pass
    return Side(name, round_, times[0], times[1:], valid, texts)


async def mmgate_side(model: str, round_: int, requests: int, tag: str) -> Side:
    server = Mmgate(model)
    try:
        await server.start()
        async with MmgateClient(server.target, timeout=300) as client:

            async def ask(content: str, record: dict[str, Any]) -> str:
                answer = await client.complete(
                    content,
                    max_tokens=MAX_TOKENS,
                    temperature=0.0,
                    cache_policy="bypass",
                    json_schema=record,
                )
                return answer.text

            return await measure("mmgate", round_, ask, requests, tag)
    finally:
        await server.close()


async def vllm_side(model: str, round_: int, requests: int, tag: str) -> Side:
    server = OpenAIServer(Settings().engine, model)
    try:
        await server.start({})

        async def ask(content: str, record: dict[str, Any]) -> str:
            body = {
                "model": server.model_name,
                "messages": [{"role": "user", "content": content}],
                "max_tokens": MAX_TOKENS,
                "temperature": 0.0,
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "record", "schema": record},
                },
            }
            answer = await server.post("/v1/chat/completions", body)
            text: str = answer["choices"][0]["message"]["content"]
            return text

        return await measure("vllm serve", round_, ask, requests, tag)
    finally:
        await server.close()


def report(sides: Sequence[Side], requests: int) -> None:
    print(f"\n{'side':<11} {'round':>5} {'first (s)':>10} {'p50 (s)':>9} {'compile (s)':>12} valid")
    for s in sides:
        print(
            f"{s.name:<11} {s.round:>5} {s.first_s:>10.3f} {s.compiled_p50:>9.3f}"
            f" {s.compile_s:>12.3f} {s.valid}/{requests + 1}"
        )
    by_round: dict[int, dict[str, Side]] = {}
    for s in sides:
        by_round.setdefault(s.round, {})[s.name] = s
    for round_, pair in sorted(by_round.items()):
        ours, theirs = pair["mmgate"], pair["vllm serve"]
        print(
            f"round {round_}: mmgate / vllm serve latency p50 "
            f"{ours.compiled_p50 / theirs.compiled_p50:.2f}x, first request "
            f"{ours.first_s / theirs.first_s:.2f}x; the same answers "
            f"{sum(a == b for a, b in zip(ours.texts, theirs.texts, strict=True))}/{requests + 1}"
        )


async def main(args: argparse.Namespace) -> None:
    for name, value in ENV.items():
        os.environ.setdefault(name, value)
    model = resolve_model(Settings())
    print(f"model {model}; {args.requests} compiled requests a side; {args.rounds} rounds")
    sides: list[Side] = []
    for round_ in range(1, args.rounds + 1):
        order = [mmgate_side, vllm_side] if round_ % 2 else [vllm_side, mmgate_side]
        # one schema a round, new to both servers (each starts fresh): the same grammar compiled
        tag = uuid.uuid4().hex[:8]
        for side in order:
            sides.append(await side(model, round_, args.requests, tag))
            print(f"  round {round_}: {sides[-1].name} done", flush=True)
    report(sides, args.requests)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        rows = [
            {**asdict(s), "compiled_p50": s.compiled_p50, "compile_s": s.compile_s} for s in sides
        ]
        args.json.write_text(json.dumps(rows, indent=2))


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.structured", description=__doc__)
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--json", type=Path)
    return parser.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
