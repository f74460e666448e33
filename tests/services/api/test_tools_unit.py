"""Tools without an engine: each bad tool, choice or tool turn names its field; forced calls
become the calls' schema; a sample's calls are read from fixed outputs, and nothing that does
not validate is handed out as a call."""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Literal

import jsonschema
import pytest

from services.api.validation import validate
from services.config import Settings
from services.engine.tools import AutoCalls, template_takes_tools
from services.errors import InvalidRequest
from services.pipeline.tool_calls import PATTERN_SECONDS, READ_SECONDS, read_calls
from services.proto.mmgate.v1 import inference_pb2 as pb
from services.tool_types import Tool, Tools

SETTINGS = Settings(max_tools=4, max_tools_chars=2000)
MAX_MODEL_LEN = 2048
WEATHER = json.dumps(
    {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
        "required": ["city"],
    }
)


def weather_tool(name: str = "get_weather", parameters: str = WEATHER) -> pb.Tool:
    return pb.Tool(name=name, description="The weather in a city", parameters=parameters)


def request_with(
    *tools: pb.Tool,
    choice: pb.ToolChoice | None = None,
    messages: list[pb.ChatMessage] | None = None,
) -> pb.GenerateRequest:
    chat = pb.Chat(
        messages=messages or [pb.ChatMessage(role="user", content="Weather in Oslo?")],
        tools=tools,
    )
    if choice is not None:
        chat.tool_choice.CopyFrom(choice)
    return pb.GenerateRequest(chat=chat)


def fields_of(request: pb.GenerateRequest) -> dict[str, str]:
    with pytest.raises(InvalidRequest) as caught:
        validate(request, SETTINGS, max_model_len=MAX_MODEL_LEN)
    return {v.field: v.description for v in caught.value.violations}


def checked_tools(request: pb.GenerateRequest) -> Tools:
    tools = validate(request, SETTINGS, max_model_len=MAX_MODEL_LEN).tools
    assert tools is not None
    return tools


REQUIRED = pb.ToolChoice(mode=pb.TOOL_CHOICE_MODE_REQUIRED)


# ── the request ─────────────────────────────────────────────────────────────────────────────


def test_tools_with_no_choice_are_auto_and_constrain_nothing() -> None:
    checked = validate(request_with(weather_tool()), SETTINGS, max_model_len=MAX_MODEL_LEN)
    assert checked.tools is not None
    assert checked.tools.choice == "auto"
    assert checked.sampling.constraint is None
    plain = validate(request_with(), SETTINGS, max_model_len=MAX_MODEL_LEN)
    assert plain.tools is None


def test_required_is_the_schema_of_a_list_of_calls_to_the_tools() -> None:
    request = request_with(weather_tool(), weather_tool("get_time", ""), choice=REQUIRED)
    request.chat.parallel_tool_calls = False
    checked = validate(request, SETTINGS, max_model_len=MAX_MODEL_LEN)
    assert checked.sampling.constraint is not None
    schema = json.loads(checked.sampling.constraint.text)
    jsonschema.validate(
        [{"name": "get_weather", "parameters": {"city": "Oslo"}}], schema
    )  # one call: valid
    with pytest.raises(jsonschema.ValidationError):  # two: parallel calls are off
        jsonschema.validate(
            [{"name": "get_time", "parameters": {}}, {"name": "get_time", "parameters": {}}],
            schema,
        )
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate([{"name": "rm", "parameters": {}}], schema)


def test_a_named_function_is_its_arguments_schema() -> None:
    checked = validate(
        request_with(weather_tool(), choice=pb.ToolChoice(function="get_weather")),
        SETTINGS,
        max_model_len=MAX_MODEL_LEN,
    )
    assert checked.sampling.constraint is not None
    assert json.loads(checked.sampling.constraint.text) == json.loads(WEATHER)


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        (request_with(weather_tool(), weather_tool()), "chat.tools[1].name"),
        (request_with(weather_tool("bad name")), "chat.tools[0].name"),
        (request_with(weather_tool("x" * 65)), "chat.tools[0].name"),
        (request_with(weather_tool(parameters='{"type": "string"}')), "chat.tools[0].parameters"),
        (request_with(weather_tool(parameters="[1, 2]")), "chat.tools[0].parameters"),
        (request_with(weather_tool(parameters="{not json")), "chat.tools[0].parameters"),
        (
            request_with(weather_tool(parameters='{"type": "object", "minProperties": "x"}')),
            "chat.tools[0].parameters",
        ),
        (
            request_with(weather_tool(parameters='{"type": "object", "$ref": "#"}')),
            "chat.tools[0].parameters",
        ),
        (
            request_with(weather_tool(), choice=pb.ToolChoice(function="get_time")),
            "chat.tool_choice.function",
        ),
        (request_with(choice=REQUIRED), "chat.tool_choice"),
        (
            request_with(weather_tool(), choice=pb.ToolChoice(mode=9)),  # type: ignore[arg-type]
            "chat.tool_choice.mode",
        ),
        (request_with(*[weather_tool(f"t{i}") for i in range(5)]), "chat.tools"),
        (request_with(pb.Tool(name="t", description="d" * 2001)), "chat.tools"),
    ],
    ids=[
        "duplicate name",
        "name with a space",
        "name too long",
        "schema of a string",
        "schema not an object",
        "schema not JSON",
        "schema not a JSON Schema",
        "schema with no end",
        "named function not among the tools",
        "required without tools",
        "unknown mode",
        "more tools than the limit",
        "more characters than the limit",
    ],
)
def test_a_bad_tool_or_choice_names_its_field(request_: pb.GenerateRequest, field: str) -> None:
    assert field in fields_of(request_)


def test_forced_calls_and_a_constraint_of_the_callers_are_refused_together() -> None:
    request = request_with(weather_tool(), choice=REQUIRED)
    request.sampling.regex = "[a-z]+"
    assert "sampling.regex" in fields_of(request)


def call(
    call_id: str, name: str = "get_weather", arguments: str = '{"city": "Oslo"}'
) -> pb.ToolCall:
    return pb.ToolCall(id=call_id, name=name, arguments=arguments)


USER = pb.ChatMessage(role="user", content="Weather in Oslo?")


def test_a_tool_turn_answers_a_call_an_earlier_turn_made() -> None:
    messages = [
        USER,
        pb.ChatMessage(role="assistant", tool_calls=[call("call-1")]),
        pb.ChatMessage(role="tool", content='{"temp": 3}', tool_call_id="call-1"),
    ]
    checked = validate(
        request_with(weather_tool(), messages=messages), SETTINGS, max_model_len=MAX_MODEL_LEN
    )
    assert checked.chat is not None
    assert checked.chat[1].tool_calls[0].arguments == '{"city":"Oslo"}'
    assert checked.chat[2].tool_call_id == "call-1"


@pytest.mark.parametrize(
    ("messages", "field"),
    [
        (
            [USER, pb.ChatMessage(role="tool", content="3", tool_call_id="call-9")],
            "chat.messages[1].tool_call_id",
        ),
        ([USER, pb.ChatMessage(role="tool", content="3")], "chat.messages[1].tool_call_id"),
        (
            [pb.ChatMessage(role="user", content="hi", tool_call_id="c")],
            "chat.messages[0].tool_call_id",
        ),
        (
            [pb.ChatMessage(role="user", content="hi", tool_calls=[call("c")])],
            "chat.messages[0].tool_calls",
        ),
        (
            [USER, pb.ChatMessage(role="assistant", tool_calls=[call("c"), call("c")])],
            "chat.messages[1].tool_calls[1].id",
        ),
        (
            [USER, pb.ChatMessage(role="assistant", tool_calls=[call("c", arguments="[1]")])],
            "chat.messages[1].tool_calls[0].arguments",
        ),
        (
            [USER, pb.ChatMessage(role="assistant", tool_calls=[call("c d")])],
            "chat.messages[1].tool_calls[0].id",
        ),
        (
            [
                USER,
                pb.ChatMessage(role="assistant", tool_calls=[call("c", arguments="[" * 100_000)]),
            ],
            "chat.messages[1].tool_calls[0].arguments",
        ),
    ],
    ids=[
        "no matching call",
        "no call id",
        "a user turn naming a call",
        "a user turn making calls",
        "two calls of one id",
        "arguments not an object",
        "an id with a space",
        "arguments nested past the parser",
    ],
)
def test_a_bad_tool_turn_names_its_field(messages: list[pb.ChatMessage], field: str) -> None:
    settings = Settings(max_prompt_chars=200_000)
    with pytest.raises(InvalidRequest) as caught:
        validate(
            request_with(weather_tool(), messages=messages), settings, max_model_len=MAX_MODEL_LEN
        )
    assert field in {v.field for v in caught.value.violations}


# ── reading the calls ───────────────────────────────────────────────────────────────────────


TOOLS = checked_tools(request_with(weather_tool(), weather_tool("get_time", "")))


def with_choice(choice: str, function: str = "") -> Tools:
    return dataclasses.replace(TOOLS, choice=choice, function=function)  # type: ignore[arg-type]


def test_required_output_becomes_calls_each_with_its_own_id() -> None:
    text = (
        '[{"name":"get_weather","parameters":{"city":"Oslo"}},{"name":"get_time","parameters":{}}]'
    )
    reading = read_calls(with_choice("required"), text, "stop", None)
    assert [(c.name, json.loads(c.arguments)) for c in reading.calls] == [
        ("get_weather", {"city": "Oslo"}),
        ("get_time", {}),
    ]
    assert len({c.id for c in reading.calls}) == 2
    assert reading.content is None
    assert reading.error == ""


def test_a_named_functions_output_is_its_arguments() -> None:
    reading = read_calls(
        with_choice("function", "get_weather"), '{"city":"Rome","days":2}', "stop", None
    )
    assert [(c.name, c.arguments) for c in reading.calls] == [
        ("get_weather", '{"city": "Rome", "days": 2}')
    ]


@pytest.mark.parametrize(
    ("choice", "text", "finish", "error"),
    [
        (
            "required",
            '[{"name":"get_weather","parameters":{"city":"Os',
            "length",
            "ended at max_tokens",
        ),
        ("required", "[]", "stop", "not a list of calls"),
        ("required", '[{"name":"rm","parameters":{}}]', "stop", "not one of the tools"),
        ("required", '[{"name":"get_weather","parameters":{"days":0}}]', "stop", "do not validate"),
        ("function", '{"city": 5}', "stop", "do not validate"),
        ("function", "[1]", "stop", "not a JSON object"),
    ],
)
def test_output_that_does_not_validate_stays_text_and_says_why(
    choice: str, text: str, finish: str, error: str
) -> None:
    reading = read_calls(with_choice(choice, "get_weather"), text, finish, None)
    assert reading.calls == ()
    assert reading.content == text
    assert error in reading.error


AUTO = AutoCalls("hermes", object())  # the hermes parser reads no vocabulary


@pytest.mark.parametrize(
    ("text", "content", "calls"),
    [
        ("It is sunny in Oslo.", "It is sunny in Oslo.", []),
        (
            'Let me look.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}'
            "\n</tool_call>",
            "Let me look.",
            [("get_weather", {"city": "Oslo"})],
        ),
        (
            '<tool_call>{"name": "get_weather", "arguments": {"city": "A"}}</tool_call>\n'
            '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>',
            None,
            [("get_weather", {"city": "A"}), ("get_time", {})],
        ),
    ],
    ids=["text", "text then a call", "two calls"],
)
def test_auto_reads_the_calls_the_model_wrote(
    text: str, content: str | None, calls: list[tuple[str, object]]
) -> None:
    reading = read_calls(with_choice("auto"), text, "stop", AUTO)
    assert reading.content == content
    assert [(c.name, json.loads(c.arguments)) for c in reading.calls] == calls
    assert reading.error == ""


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ('<tool_call>\n{"name": "get_weather", "arguments": {"city": ', "could not be read"),
        ("<tool_call>not json</tool_call>", "could not be read"),
        ('<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>', "not one of the tools"),
        (
            '<tool_call>{"name": "get_weather", "arguments": {"days": 3}}</tool_call>',
            "do not validate",
        ),
        (
            '<tool_call>{"name": "get_weather", "arguments": "city"}</tool_call>',
            "not a JSON object",
        ),
    ],
    ids=["cut short", "not JSON", "unknown function", "missing argument", "arguments a string"],
)
def test_auto_hands_out_no_call_that_does_not_validate(text: str, error: str) -> None:
    reading = read_calls(with_choice("auto"), text, "stop", AUTO)
    assert reading.calls == ()
    assert reading.content == text
    assert error in reading.error


def test_auto_read_piece_by_piece_hands_out_calls_only_once_whole() -> None:
    whole = 'Sure.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    for end in range(1, len(whole)):
        reading = read_calls(with_choice("auto"), whole[:end], "length", AUTO)
        # a prefix is text, or text and the reason its call is not one yet, never a bad call
        for made in reading.calls:
            jsonschema.validate(json.loads(made.arguments), json.loads(WEATHER))
    assert len(read_calls(with_choice("auto"), whole, "stop", AUTO).calls) == 1


def test_a_pattern_that_backtracks_without_end_fails_the_call_within_its_bound() -> None:
    evil = json.dumps(
        {"type": "object", "properties": {"city": {"type": "string", "pattern": "^(a|aa)+$"}}}
    )
    tools = checked_tools(request_with(weather_tool(parameters=evil)))
    text = (
        '<tool_call>{"name": "get_weather", "arguments": {"city": "' + "a" * 60 + '!"}}</tool_call>'
    )
    started = time.thread_time()
    reading = read_calls(tools, text, "stop", AUTO)
    assert time.thread_time() - started < 20 * PATTERN_SECONDS
    assert reading.calls == ()
    assert "took too long" in reading.error


def test_none_reads_no_calls() -> None:
    text = '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>'
    assert read_calls(with_choice("none"), text, "stop", AUTO).calls == ()


def test_which_model_templates_take_tools() -> None:
    assert not template_takes_tools("{% for m in messages %}{{ m.content }}{% endfor %}")
    assert template_takes_tools("{% if tools %}{{ tools | tojson }}{% endif %}")
    assert template_takes_tools({"default": "{{ x }}", "tool_use": "{{ tools }}"})
    assert not template_takes_tools(None)


def test_an_answers_patterns_are_bounded_together_not_each_alone() -> None:
    # 200 properties whose pattern matches, slowly (~10 ms here), each within its own bound:
    # 2 s of a thread for one answer without the bound of all of them together
    names = [f"p{i}" for i in range(200)]
    slow = "^(?:(a|aa)+x|a*)$"
    schema = {
        "type": "object",
        "properties": {name: {"type": "string", "pattern": slow} for name in names},
    }
    tools = Tools((Tool("fill", "", json.dumps(schema)),), "auto")
    arguments = {name: "a" * 23 for name in names}
    text = f"<tool_call>{json.dumps({'name': 'fill', 'arguments': arguments})}</tool_call>"
    started = time.monotonic()
    reading = read_calls(tools, text, "stop", AUTO)
    assert time.monotonic() - started < READ_SECONDS + 0.5
    assert reading.calls == ()
    assert "took too long" in reading.error


def test_each_call_stands_on_its_own_those_after_a_bad_one_are_not_handed_out() -> None:
    text = (
        '[{"name":"get_weather","parameters":{"city":"Oslo"}},'
        '{"name":"get_weather","parameters":{"days":2}},'
        '{"name":"get_time","parameters":{}}]'
    )
    reading = read_calls(with_choice("required"), text, "stop", None)
    assert [json.loads(c.arguments) for c in reading.calls] == [{"city": "Oslo"}]
    assert "do not validate" in reading.error


def test_a_list_cut_at_max_tokens_keeps_its_whole_calls_and_says_it_was_cut() -> None:
    text = '[{"name":"get_time","parameters":{}}, {"name":"get_weather","parameters":{"ci'
    reading = read_calls(with_choice("required"), text, "length", None)
    assert [c.name for c in reading.calls] == ["get_time"]
    assert "ended at max_tokens" in reading.error
    # read before the end: the whole calls so far, nothing said of the rest
    early = read_calls(with_choice("required"), text, None, None, final=False)
    assert ([c.name for c in early.calls], early.error) == (["get_time"], "")


def test_calls_handed_out_keep_their_ids_at_the_end() -> None:
    text = '[{"name":"get_time","parameters":{}},{"name":"get_time","parameters":{}}]'
    reading = read_calls(with_choice("required"), text, "stop", None, ids=["call-a"])
    assert reading.calls[0].id == "call-a"
    assert reading.calls[1].id not in ("", "call-a")


@pytest.mark.parametrize("choice", ["required", "function"])
def test_output_nested_past_the_parser_is_no_call(choice: str) -> None:
    text = "[" * 5000
    reading = read_calls(with_choice(choice, "get_time"), text, "length", None)
    assert reading.calls == ()
    assert reading.content == text


def test_a_functions_signature_is_its_tool() -> None:
    from services.client import as_tool, tool_choice, tool_from_function

    def search(query: str, limit: int = 5, tags: list[str] | None = None) -> str:
        """Search the docs.

        Longer notes that stay out of the description."""
        return query

    def pick(unit: Literal["c", "f"], weights: dict[str, float]) -> None:
        """Pick one."""

    tool = tool_from_function(search)
    assert (tool.name, tool.description) == ("search", "Search the docs.")
    assert json.loads(tool.parameters) == {
        "type": "object",
        "properties": {
            "query": {"type": "string"},
            "limit": {"type": "integer", "default": 5},
            "tags": {
                "anyOf": [{"type": "array", "items": {"type": "string"}}, {"type": "null"}],
                "default": None,
            },
        },
        "required": ["query"],
    }
    assert json.loads(tool_from_function(pick).parameters)["properties"] == {
        "unit": {"enum": ["c", "f"]},
        "weights": {"type": "object", "additionalProperties": {"type": "number"}},
    }
    # what the server checks it against: a valid object schema
    validate(request_with(tool, as_tool(pick)), SETTINGS, max_model_len=MAX_MODEL_LEN)
    assert (
        as_tool({"name": "t", "parameters": {"type": "object"}}).parameters == '{"type": "object"}'
    )
    assert tool_choice("required").mode == pb.TOOL_CHOICE_MODE_REQUIRED
    assert tool_choice("search").function == "search"
