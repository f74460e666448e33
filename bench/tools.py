"""Tool calls side by side: mmgate against vLLM's OpenAI server, the same model, tools, template
and requests (tool_choice "required"), one server at a time.

    for each round, each side (the order alternates):
        start the server ─▶ N sampled requests (temperature 1, seed i), one at a time ─▶ stop

vLLM's server renders the tools with mmgate's Hermes-style template (``--chat-template``, the
same text: the embedded SmolLM2's own template ignores tools) and builds the same JSON Schema for
"required" calls. Each side's calls are checked the same way here: a call to one of the tools
whose arguments validate against its schema (jsonschema). Whole answers (mmgate's Complete,
vLLM's chat completion unstreamed); latency p50 per side, and its ratio.

Two of vLLM's: as it comes (the hermes parser holds "required" calls to its format by a
structural tag) and with VLLM_ENFORCE_STRICT_TOOL_CALLING=0 (to the calls' JSON Schema, as
mmgate does).

    python -m bench.tools [--requests 20] [--rounds 2] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import jsonschema

from services.client import MmgateClient
from services.config import Settings
from services.models import resolve_model
from services.pipeline.tool_template import standalone_template

from .openai_server import OpenAIServer
from .service import ENV, Mmgate

MAX_TOKENS = 96
VLLM, VLLM_JSON = "vllm serve", "vllm serve, JSON"
CITY = {"type": "string", "pattern": "^[A-Za-z ]{1,20}$"}
TOOLS: list[dict[str, Any]] = [
    {
        "name": "get_weather",
        "description": "The weather now in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": CITY, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"],
        },
    },
    {
        "name": "get_time",
        "description": "The time now in a city.",
        "parameters": {"type": "object", "properties": {"city": CITY}, "required": ["city"]},
    },
]
SCHEMAS: dict[str, dict[str, Any]] = {tool["name"]: tool["parameters"] for tool in TOOLS}
CITIES = ["Oslo", "Lima", "Cairo", "Hanoi", "Quito", "Perth", "Dakar", "Riga", "Sofia", "Bern"]
Ask = Callable[[str, int], Awaitable[list[tuple[str, str]]]]


def question(i: int) -> str:
    return f"What is the weather in {CITIES[i % len(CITIES)]} right now?"


def valid(calls: list[tuple[str, str]]) -> bool:
    """At least one call, each to one of the tools with arguments valid against its schema."""
    if not calls:
        return False
    try:
        for name, arguments in calls:
            jsonschema.validate(json.loads(arguments), SCHEMAS[name])
    except (KeyError, ValueError, jsonschema.ValidationError):
        return False
    return True


@dataclass
class Side:
    name: str
    round: int
    seconds: list[float]
    valid: int

    @property
    def p50(self) -> float:
        return statistics.median(self.seconds)


async def measure(name: str, round_: int, ask: Ask, requests: int) -> Side:
    seconds, good = [], 0
    for i in range(requests):
        started = time.perf_counter()
        calls = await ask(question(i), i)
        seconds.append(time.perf_counter() - started)
        good += valid(calls)
    return Side(name, round_, seconds, good)


async def mmgate_side(model: str, round_: int, requests: int) -> Side:
    server = Mmgate(model)
    try:
        await server.start()
        async with MmgateClient(server.target, timeout=300) as client:

            async def ask(content: str, seed: int) -> list[tuple[str, str]]:
                answer = await client.complete(
                    content,
                    tools=TOOLS,
                    tool_choice="required",
                    parallel_tool_calls=False,
                    max_tokens=MAX_TOKENS,
                    temperature=1.0,
                    seed=seed,
                    cache_policy="bypass",
                )
                return [(c.name, c.arguments) for c in answer.choices[0].end.tool_calls]

            return await measure("mmgate", round_, ask, requests)
    finally:
        await server.close()


async def vllm_side(model: str, round_: int, requests: int, *, strict: bool = True) -> Side:
    """vLLM's server with the hermes parser; ``strict`` (its default): "required" calls held to
    the Hermes format by a structural tag, else (VLLM_ENFORCE_STRICT_TOOL_CALLING=0) to the
    calls' JSON Schema, as mmgate holds them."""
    server = OpenAIServer(Settings().engine, model)
    with tempfile.NamedTemporaryFile("w", suffix=".jinja") as template:
        template.write(standalone_template())
        template.flush()
        try:
            await server.start(
                {} if strict else {"VLLM_ENFORCE_STRICT_TOOL_CALLING": "0"},
                *("--chat-template", template.name),
                *("--enable-auto-tool-choice", "--tool-call-parser", "hermes"),
            )

            async def ask(content: str, seed: int) -> list[tuple[str, str]]:
                body = {
                    "model": server.model_name,
                    "messages": [{"role": "user", "content": content}],
                    "tools": [{"type": "function", "function": tool} for tool in TOOLS],
                    "tool_choice": "required",
                    "parallel_tool_calls": False,
                    "max_tokens": MAX_TOKENS,
                    "temperature": 1.0,
                    "seed": seed,
                }
                answer = await server.post("/v1/chat/completions", body)
                calls = answer["choices"][0]["message"].get("tool_calls") or []
                return [(c["function"]["name"], c["function"]["arguments"]) for c in calls]

            return await measure(VLLM if strict else VLLM_JSON, round_, ask, requests)
        finally:
            await server.close()


async def vllm_json_side(model: str, round_: int, requests: int) -> Side:
    return await vllm_side(model, round_, requests, strict=False)


def report(sides: Sequence[Side], requests: int) -> None:
    print(f"\n{'side':<17} {'round':>5} {'p50 (s)':>9} valid calls")
    for s in sides:
        print(f"{s.name:<17} {s.round:>5} {s.p50:>9.3f} {s.valid}/{requests}")
    by_round: dict[int, dict[str, Side]] = {}
    for s in sides:
        by_round.setdefault(s.round, {})[s.name] = s
    for round_, named in sorted(by_round.items()):
        ours = named["mmgate"]
        for name in (VLLM, VLLM_JSON):
            theirs = named[name]
            print(
                f"round {round_}: mmgate / {name} latency p50 {ours.p50 / theirs.p50:.2f}x;"
                f" valid calls {ours.valid}/{requests} against {theirs.valid}/{requests}"
            )


async def main(args: argparse.Namespace) -> None:
    for name, value in ENV.items():
        os.environ.setdefault(name, value)
    model = resolve_model(Settings())
    print(f"model {model}; {args.requests} requests a side; {args.rounds} rounds")
    sides: list[Side] = []
    for round_ in range(1, args.rounds + 1):
        sides_ = [mmgate_side, vllm_side, vllm_json_side]
        order = sides_ if round_ % 2 else sides_[::-1]
        for side in order:
            sides.append(await side(model, round_, args.requests))
            print(f"  round {round_}: {sides[-1].name} done", flush=True)
    report(sides, args.requests)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps([{**asdict(s), "p50": s.p50} for s in sides], indent=2))


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.tools", description=__doc__)
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", type=Path)
    return parser.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
