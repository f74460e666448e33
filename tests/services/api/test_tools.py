"""Tool calls end to end on the embedded SmolLM2 (the real engine over real gRPC; its own
template ignores tools, so mmgate's Hermes-style template renders them): forced calls validate
against their function's schema whatever the model samples; a call, its result and the answer
make a round trip, streamed and unary; every sample of n has its calls; requests with other
tools never share a prompt or a response; ModelInfo says how tools are rendered and read."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any, Literal

import grpc
import jsonschema
import pytest

from services.client import (
    MmgateClient,
    build_request,
    calls_turn,
    tool_from_function,
    tool_result,
)
from services.proto.mmgate.v1 import inference_pb2 as pb
from tests.services.statuses import violated_fields
from tests.support import RunningServer


def get_weather(city: str, unit: Literal["celsius", "fahrenheit"] = "celsius") -> str:
    """The weather now in a city."""
    return f"12 degrees {unit} and clear in {city}"


def get_time(timezone: str) -> str:
    """The time now in a timezone."""
    return f"10:00 in {timezone}"


def bounded(tool: pb.Tool) -> pb.Tool:
    """The function's tool, its strings bounded: a small model sampled hot can write a string
    without end (a 60-token "timezone"), and max_tokens then ends the call unfinished."""
    schema = json.loads(tool.parameters)
    for argument in schema["properties"].values():
        if argument.get("type") == "string":
            argument["pattern"] = "^[A-Za-z /_]{1,24}$"
    tool.parameters = json.dumps(schema)
    return tool


TOOLS = [bounded(tool_from_function(get_weather)), bounded(tool_from_function(get_time))]
SCHEMAS = {tool.name: json.loads(tool.parameters) for tool in TOOLS}
QUESTION = "What is the weather in Oslo right now?"


@pytest.fixture
async def client(smollm2_server: RunningServer) -> Any:
    async with smollm2_server.client(timeout=120) as client:
        yield client


def assert_valid(calls: Any, names: set[str]) -> None:
    assert calls, "no calls"
    for made in calls:
        assert made.name in names
        assert made.id
        jsonschema.validate(json.loads(made.arguments), SCHEMAS[made.name])


@pytest.mark.parametrize("choice", ["required", "get_weather"])
async def test_twenty_sampled_answers_each_return_calls_that_validate(
    client: MmgateClient, choice: str
) -> None:
    answers = await asyncio.gather(
        *(
            client.complete(
                f"{QUESTION} ({uuid.uuid4().hex[:6]})",
                tools=TOOLS,
                tool_choice=choice,
                # one call each: a small model sampled at temperature 1 may go on adding
                # calls to the list until max_tokens ends it (then no call is handed out)
                parallel_tool_calls=False,
                temperature=1.0,
                seed=seed,
                max_tokens=64,
                cache_policy="bypass",
            )
            for seed in range(20)
        )
    )
    names = {"get_weather", "get_time"} if choice == "required" else {"get_weather"}
    for answer in answers:
        end = answer.choices[0].end
        assert end.tool_parse_error == "", answer.choices[0].text
        assert_valid(end.tool_calls, names)
        assert end.finish_reason == pb.FINISH_REASON_TOOL_CALLS
        assert answer.final.finish_reason == pb.FINISH_REASON_TOOL_CALLS
        assert answer.choices[0].text == ""  # nothing outside the calls


async def round_trip(client: MmgateClient, *, streamed: bool) -> str:
    asked = await client.complete(
        QUESTION, tools=TOOLS, tool_choice="get_weather", temperature=0.0, max_tokens=64
    )
    calls = asked.choices[0].end.tool_calls
    assert_valid(calls, {"get_weather"})
    results = [tool_result(c.id, get_weather(**json.loads(c.arguments))) for c in calls]
    messages: list[tuple[str, str] | pb.ChatMessage] = [
        ("user", QUESTION),
        calls_turn(calls),
        *results,
    ]
    options: dict[str, Any] = {"tools": TOOLS, "tool_choice": "none", "max_tokens": 48}
    if not streamed:
        answer = await client.complete(messages=messages, temperature=0.0, **options)
        assert answer.final.finish_reason != pb.FINISH_REASON_TOOL_CALLS
        assert answer.choices[0].end.tool_calls == []
        return answer.text
    texts, final = [], None
    async for event in client.generate(
        build_request(messages=messages, temperature=0.0, **options)
    ):
        if event.HasField("final"):
            final = event.final
        else:
            texts.append(event.delta.text)
    assert final is not None
    assert final.samples[0].tool_calls == []
    return "".join(texts)


async def test_a_call_its_result_and_the_answer_unary_and_streamed(client: MmgateClient) -> None:
    unary = await round_trip(client, streamed=False)
    streamed = await round_trip(client, streamed=True)
    assert unary.strip()
    assert streamed == unary  # greedy: the same answer either way


async def test_three_samples_each_have_their_calls(client: MmgateClient) -> None:
    answer = await client.complete(
        QUESTION,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        n=3,
        temperature=1.0,
        seed=7,
        max_tokens=64,
    )
    assert [choice.index for choice in answer.choices] == [0, 1, 2]
    for choice in answer.choices:
        assert_valid(choice.end.tool_calls, {"get_weather", "get_time"})
    ids = [c.id for choice in answer.choices for c in choice.end.tool_calls]
    assert len(ids) == len(set(ids))  # unique in the answer


async def test_a_streamed_answer_ends_with_each_samples_calls(client: MmgateClient) -> None:
    events = [
        event
        async for event in client.generate(
            build_request(
                prompt=QUESTION,
                tools=TOOLS,
                tool_choice="required",
                parallel_tool_calls=False,
                n=2,
                temperature=1.0,
                seed=3,
                max_tokens=96,
            )
        )
    ]
    texts: dict[int, str] = {0: "", 1: ""}
    streamed: dict[int, list[tuple[str, str, str]]] = {0: [], 1: []}
    for event in events[:-1]:
        texts[event.delta.index] += event.delta.text
        streamed[event.delta.index] += [(c.id, c.name, c.arguments) for c in event.delta.tool_calls]
    final = events[-1].final
    for sample in final.samples:
        assert_valid(sample.tool_calls, {"get_weather", "get_time"})
        # each call went out whole in the stream, under the id the final message gives it
        assert streamed[sample.index] == [(c.id, c.name, c.arguments) for c in sample.tool_calls]
        # the stream carries the calls' JSON as the model wrote it
        written = json.loads(texts[sample.index])
        assert [call["name"] for call in written] == [c.name for c in sample.tool_calls]


async def test_requests_with_other_tools_share_neither_prompt_nor_response(
    client: MmgateClient,
) -> None:
    question = f"{QUESTION} ({uuid.uuid4().hex[:6]})"
    first = await client.complete(
        question, tools=TOOLS[:1], temperature=0.0, max_tokens=8, cache_policy="response"
    )
    again = await client.complete(
        question, tools=TOOLS[:1], temperature=0.0, max_tokens=8, cache_policy="response"
    )
    other = await client.complete(
        question, tools=TOOLS, temperature=0.0, max_tokens=8, cache_policy="response"
    )
    forced = await client.complete(
        question,
        tools=TOOLS[:1],
        tool_choice="required",
        temperature=0.0,
        max_tokens=8,
        cache_policy="response",
    )

    def outcomes(answer: pb.CompleteResponse) -> dict[str, str]:
        return {lookup.stage: lookup.outcome for lookup in answer.final.cache.lookups}

    assert outcomes(first) == {"prompt": "miss", "response": "miss"}
    assert outcomes(again) == {"prompt": "hit", "response": "hit"}  # the same tools: shared
    assert outcomes(other) == {"prompt": "miss", "response": "miss"}
    assert outcomes(forced) == {"prompt": "hit", "response": "miss"}  # same prompt, other choice


async def test_model_info_says_how_tools_are_rendered_and_read(client: MmgateClient) -> None:
    info = await client.model_info()
    assert info.tool_template == "hermes"  # SmolLM2's own template ignores tools
    assert info.tool_parser == "hermes"
    assert info.limits.max_tools > 0
    assert info.limits.max_tools_chars > 0


async def test_bad_tools_are_refused_naming_their_fields(client: MmgateClient) -> None:
    bad = pb.Tool(name="get_weather", parameters='{"type": "array"}')
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await client.complete(QUESTION, tools=[TOOLS[0], bad], tool_choice="get_time")
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert {"chat.tools[1].name"} <= violated_fields(refused.value)
    # and the server goes on serving
    answer = await client.complete(
        QUESTION, tools=TOOLS, tool_choice="required", parallel_tool_calls=False, max_tokens=64
    )
    assert answer.choices[0].end.tool_calls


async def test_auto_hands_out_only_calls_that_validate_and_text_as_text(
    client: MmgateClient,
) -> None:
    # the model chooses: whatever it writes, a call handed out is valid, and an answer without
    # one (or with one that is not) is text, the reason said
    questions = [
        QUESTION,
        "What time is it in Tokyo?",
        "Say hello.",
        "What is two plus two?",
        "Tell me the weather in Paris and the time in Rome.",
    ]
    answers = await asyncio.gather(
        *(
            client.complete(q, tools=TOOLS, temperature=1.0, seed=seed, max_tokens=64, n=2)
            for seed, q in enumerate(questions)
        )
    )
    called = texts = 0
    for answer in answers:
        for choice in answer.choices:
            end = choice.end
            if end.tool_calls:
                called += 1
                assert_valid(end.tool_calls, {"get_weather", "get_time"})
                assert end.finish_reason == pb.FINISH_REASON_TOOL_CALLS
                assert "<tool_call>" not in choice.text
            else:
                texts += 1
                assert end.finish_reason != pb.FINISH_REASON_TOOL_CALLS
                assert choice.text.strip() or end.tool_parse_error
    assert called + texts == 10


# the model made to write a Hermes call with a constraint of the caller's (auto takes one): the
# whole path of an "auto" call, template, engine, vLLM's hermes parser and mmgate's check
HERMES_CALL = (
    r'<tool_call>\n\{{"name": "get_weather", "arguments": '
    r'\{{"{0}": "[A-Z][a-z]{{2,9}}"\}}\}}\n</tool_call>'
)
CALL, WRONG = HERMES_CALL.format("city"), HERMES_CALL.format("town")


async def test_an_auto_call_is_read_through_the_parser_and_checked(client: MmgateClient) -> None:
    made = await client.complete(QUESTION, tools=TOOLS, regex=CALL, max_tokens=48)
    (call,) = made.choices[0].end.tool_calls
    assert call.name == "get_weather"
    jsonschema.validate(json.loads(call.arguments), SCHEMAS["get_weather"])
    assert made.final.finish_reason == pb.FINISH_REASON_TOOL_CALLS
    assert made.text == ""  # nothing outside the call

    wrong = await client.complete(QUESTION, tools=TOOLS, regex=WRONG, max_tokens=48)
    assert wrong.choices[0].end.tool_calls == []
    assert "do not validate" in wrong.choices[0].end.tool_parse_error
    assert wrong.text.startswith("<tool_call>")  # handed back as text
    assert wrong.final.finish_reason == pb.FINISH_REASON_STOP
