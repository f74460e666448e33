"""A reasoning model's thinking kept apart from its answer: vLLM's olmo3 parser (it reads
<think> and </think> as text, which SmolLM2's vocabulary spells) on fixed outputs cut every
way, then the whole server over the synthetic engine answering with thinking, streamed token by
token and whole, its thinking sent or left out; a parser the model cannot take is refused at
start; and the real engine, SmolLM2 made to think by a constraint."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from transformers import AutoTokenizer

from services.api.server import MmgateServer
from services.client import build_request
from services.config import default_model_cache
from services.engine.reasoning import ReasoningParsers
from services.models import prepare_default_model
from services.proto.mmgate.v1 import inference_pb2 as pb
from tests.services.api.synthetic_server import client_of, synthetic_server
from tests.support import RunningServer, start_server

module_loop = pytest.mark.asyncio(loop_scope="module")

THINKING = "Two and two: count them, one two three four"
ANSWER = "The answer is four."
OUTPUT = f"<think>{THINKING}</think>{ANSWER}"


@pytest.fixture(scope="module")
def smollm2() -> Path:
    return prepare_default_model(default_model_cache())


@pytest.fixture(scope="module")
def parsers(smollm2: Path) -> ReasoningParsers:
    return ReasoningParsers("olmo3", AutoTokenizer.from_pretrained(smollm2))


@pytest.mark.parametrize("size", [1, 2, 3, 5, 7, 11, len(OUTPUT)])
def test_an_output_cut_anywhere_splits_the_same(parsers: ReasoningParsers, size: int) -> None:
    sample = parsers.sample()
    pieces = [OUTPUT[at : at + size] for at in range(0, len(OUTPUT), size)]
    reasoning = content = ""
    for i, piece in enumerate(pieces):
        thought, said = sample.split(piece, (), last=i == len(pieces) - 1)
        reasoning += thought
        content += said
    assert (reasoning, content) == (THINKING, ANSWER)


def test_text_a_parser_held_back_is_handed_out_where_the_whole_output_places_it(
    parsers: ReasoningParsers,
) -> None:
    # "</think>" cut over two deltas, the last: the parser held "</th" back, waiting to see the
    # tag whole; the last delta's split completes the answer from the whole output's reading
    sample = parsers.sample()
    parts = [
        sample.split("<think>let me see", (), last=False),
        sample.split("</th", (), last=False),
        sample.split("ink>Four", (), last=True),
    ]
    assert ("".join(p[0] for p in parts), "".join(p[1] for p in parts)) == ("let me see", "Four")


def test_where_the_stream_and_the_whole_reading_part_the_stream_stands(
    parsers: ReasoningParsers,
) -> None:
    # cut at max_tokens inside "</think>": the stream had begun the thinking; read whole, the
    # output has no thinking (never closed). Nothing is handed out twice: the thinking stays
    # thinking, and the fragment of a tag is not made an answer
    sample = parsers.sample()
    first = sample.split("<think>let me", (), last=False)
    second = sample.split(" see</th", (), last=True)
    assert (first[0] + second[0], first[1] + second[1]) == ("let me", "")


def test_a_parser_the_tokenizer_cannot_take_is_refused(smollm2: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(smollm2)
    with pytest.raises(ValueError, match="cannot read this model's output"):
        ReasoningParsers("deepseek_r1", tokenizer)  # its <think> is one token SmolLM2 lacks
    with pytest.raises(ValueError, match="no reasoning parser named"):
        ReasoningParsers("no_such_parser", tokenizer)


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def thinking(
    smollm2: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[tuple[MmgateServer, InMemorySpanExporter]]:
    # the synthetic engine answers every request with OUTPUT, a token a step
    async with synthetic_server(
        str(smollm2),
        tmp_path_factory.mktemp("thinking"),
        step_seconds=0.001,
        engine={
            "reasoning_parser": "olmo3",
            "synthetic": {"step_seconds": 0.001, "answer": OUTPUT},
        },
    ) as started:
        yield started


@module_loop
async def test_a_stream_sends_the_thinking_apart_from_the_answer(
    thinking: tuple[MmgateServer, InMemorySpanExporter],
) -> None:
    server, _ = thinking
    async with client_of(server) as client:
        events = [e async for e in client.generate(build_request("What is 2 + 2?", max_tokens=64))]
        info = await client.model_info()
    deltas = [event.delta for event in events[:-1]]
    assert len(deltas) > 10  # token by token
    assert "".join(d.reasoning for d in deltas) == THINKING
    assert "".join(d.text for d in deltas) == ANSWER
    # the thinking comes first, then the answer: no delta of the answer before the last thought
    last_thought = max(i for i, d in enumerate(deltas) if d.reasoning)
    assert all(not d.text for d in deltas[: last_thought + 1])
    assert info.reasoning_parser == "olmo3"


@module_loop
async def test_a_whole_answer_has_its_thinking_in_a_field_of_its_own(
    thinking: tuple[MmgateServer, InMemorySpanExporter],
) -> None:
    server, _ = thinking
    async with client_of(server) as client:
        answer = await client.complete("What is 2 + 2?", max_tokens=64, n=2, temperature=0.5)
        left_out = await client.complete_request(
            _without_reasoning(build_request("What is 2 + 2?", max_tokens=64))
        )
    for choice in answer.choices:
        assert (choice.reasoning, choice.text) == (THINKING, ANSWER)
    assert answer.text == ANSWER
    assert (left_out.choices[0].reasoning, left_out.text) == ("", ANSWER)


def _without_reasoning(request: pb.GenerateRequest) -> pb.GenerateRequest:
    request.include_reasoning = False
    return request


@module_loop
async def test_the_thinking_is_never_read_as_a_call(
    thinking: tuple[MmgateServer, InMemorySpanExporter],
) -> None:
    server, _ = thinking
    async with client_of(server) as client:
        answer = await client.complete(
            "What is 2 + 2?",
            max_tokens=64,
            tools=[{"name": "add", "parameters": {"type": "object"}}],
        )
    assert answer.choices[0].end.tool_calls == []
    assert answer.choices[0].end.tool_parse_error == ""
    assert (answer.choices[0].reasoning, answer.text) == (THINKING, ANSWER)


# ── the real engine: SmolLM2 made to think by a constraint ──────────────────────────────────

THOUGHT_THEN_ANSWER = r"<think>[a-z ]{8,40}</think>[A-Z][a-z ]{4,30}\."


@pytest.fixture(scope="module")
def thinking_smollm2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """`mmgate serve` on the embedded SmolLM2 with the olmo3 reasoning parser."""
    running = start_server(
        tmp_path_factory.mktemp("thinking-smollm2"), None, MMGATE_ENGINE__REASONING_PARSER="olmo3"
    )
    yield running
    assert running.stop() == 0, running.log()


@module_loop
async def test_the_real_engines_thinking_is_split_alike_streamed_and_whole(
    thinking_smollm2: RunningServer,
) -> None:
    options: dict[str, Any] = {"regex": THOUGHT_THEN_ANSWER, "max_tokens": 64, "temperature": 0.0}
    async with thinking_smollm2.client(timeout=120) as client:
        whole = await client.complete("What is two plus two?", **options)
        events = [
            event
            async for event in client.generate(build_request("What is two plus two?", **options))
        ]
        alone = await client.complete_request(
            _without_reasoning(build_request("What is two plus two?", **options))
        )
    choice = whole.choices[0]
    assert re.fullmatch(r"[a-z ]{8,40}", choice.reasoning), choice
    assert re.fullmatch(r"[A-Z][a-z ]{4,30}\.", choice.text), choice
    streamed = [event.delta for event in events[:-1]]
    assert "".join(d.reasoning for d in streamed) == choice.reasoning
    assert "".join(d.text for d in streamed) == choice.text
    assert (alone.choices[0].reasoning, alone.text) == ("", choice.text)
