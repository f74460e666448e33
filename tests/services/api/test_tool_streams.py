"""Calls in a stream: each handed out whole and checked in the delta that completes it, under
the id the final message gives it; a call that does not check is never streamed, and those
before it stand. The whole server over the synthetic engine answering fixed calls, token by
token (services/engine/synthetic.py's ``answer``)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from services.api.server import MmgateServer
from services.client import build_request
from services.proto.mmgate.v1 import inference_pb2 as pb
from tests.services.api.synthetic_server import client_of, synthetic_server

module_loop = pytest.mark.asyncio(loop_scope="module")

WEATHER = {
    "name": "get_weather",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
TIME = {"name": "get_time", "parameters": {"type": "object", "properties": {}}}
HERMES = (
    "Let me look.<tool_call>\n"
    '{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
)
LISTED = (
    '[{"name": "get_weather", "parameters": {"city": "Oslo"}}, '
    '{"name": "get_weather", "parameters": {"town": "Rome"}}, '
    '{"name": "get_time", "parameters": {}}]'
)


async def answered(
    server: MmgateServer, max_tokens: int = 200, **options: Any
) -> list[pb.GenerateResponse]:
    async with client_of(server) as client:
        request = build_request("Weather?", max_tokens=max_tokens, tools=[WEATHER, TIME], **options)
        return [event async for event in client.generate(request)]


@contextlib.asynccontextmanager
async def answering(tiny_model: str, directory: Path, answer: str) -> AsyncIterator[MmgateServer]:
    """The whole server over the synthetic engine, ``answer`` every request's output."""
    synthetic = {"step_seconds": 0.001, "answer": answer}
    async with synthetic_server(
        tiny_model, directory, step_seconds=0.001, engine={"synthetic": synthetic}
    ) as (server, _):
        yield server


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def hermes_server(
    tiny_model: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[MmgateServer]:
    async with answering(tiny_model, tmp_path_factory.mktemp("hermes-calls"), HERMES) as server:
        yield server


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def listed_server(
    tiny_model: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[MmgateServer]:
    async with answering(tiny_model, tmp_path_factory.mktemp("listed-calls"), LISTED) as server:
        yield server


@module_loop
async def test_auto_calls_stream_each_whole_once_its_tag_closes(
    hermes_server: MmgateServer,
) -> None:
    events = await answered(hermes_server)
    deltas = [event.delta for event in events[:-1]]
    with_calls = [(i, d) for i, d in enumerate(deltas) if d.tool_calls]
    assert [[c.name for c in d.tool_calls] for _, d in with_calls] == [
        ["get_weather"],
        ["get_time"],
    ]
    text = "".join(d.text for d in deltas)
    # each call goes out in the delta that ends its </tool_call>, not a token before
    for i, delta in with_calls:
        before = "".join(d.text for d in deltas[:i])
        assert before.count("</tool_call>") < (before + delta.text).count("</tool_call>")
    assert text == HERMES  # the stream's text is the model's, as written
    final = events[-1].final.samples[0]
    streamed = [c for _, d in with_calls for c in d.tool_calls]
    assert [(c.id, c.name, c.arguments) for c in final.tool_calls] == [
        (c.id, c.name, c.arguments) for c in streamed
    ]
    assert json.loads(final.tool_calls[0].arguments) == {"city": "Oslo"}
    assert events[-1].final.finish_reason == pb.FINISH_REASON_TOOL_CALLS


@module_loop
async def test_a_required_list_streams_its_calls_until_one_does_not_check(
    listed_server: MmgateServer,
) -> None:
    # the synthetic engine holds no constraint: the second call misses its required "city"
    events = await answered(listed_server, tool_choice="required")
    streamed = [c for event in events[:-1] for c in event.delta.tool_calls]
    assert [(c.name, json.loads(c.arguments)) for c in streamed] == [
        ("get_weather", {"city": "Oslo"})
    ]
    final = events[-1].final.samples[0]
    assert [c.id for c in final.tool_calls] == [streamed[0].id]
    assert "get_weather's arguments do not validate" in final.tool_parse_error
    assert "city" in final.tool_parse_error


@module_loop
async def test_a_whole_answer_has_the_same_calls_without_a_stream(
    hermes_server: MmgateServer,
) -> None:
    async with client_of(hermes_server) as client:
        answer = await client.complete("Weather?", max_tokens=200, tools=[WEATHER, TIME])
    choice = answer.choices[0]
    assert [c.name for c in choice.end.tool_calls] == ["get_weather", "get_time"]
    assert choice.text == "Let me look."


@module_loop
async def test_a_call_cut_by_max_tokens_is_never_streamed(hermes_server: MmgateServer) -> None:
    # 30 tokens end inside the first call's JSON
    events = await answered(hermes_server, max_tokens=30)
    assert not any(event.delta.tool_calls for event in events[:-1])
    final = events[-1].final.samples[0]
    assert list(final.tool_calls) == []
    assert final.finish_reason == pb.FINISH_REASON_LENGTH
