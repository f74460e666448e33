"""A chat's tools, tool choice and tool turns, checked before the prompt is rendered.

    Chat.tools ─ count, size, names, each schema (bounded as a constraint is) ─┐
    Chat.tool_choice, parallel_tool_calls ─ what the answer may be ────────────┼▶ Tools
    ChatMessage.tool_calls, tool_call_id ─ each result answers a call made ────┘
    "required" or a function ─▶ the calls' JSON Schema (services/engine/tools.py): the
        request's constraint, so the engine writes nothing but valid calls

A choice that forces calls takes the place of SamplingParams' constraint: the two together are
refused.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from typing import Any

from ..config import Settings
from ..engine.tools import calls_schema
from ..pipeline.tool_calls import schema_problem
from ..proto.mmgate.v1 import inference_pb2 as pb
from ..tool_types import Tool, ToolCall, ToolChoiceMode, Tools
from ..types import Constraint
from .constraints import checked_schema

# a function's name, as OpenAI's API and vLLM's parsers take it
TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
# an id of a call a chat sends back: what the calls mmgate hands out look like, and more
CALL_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
_NO_ARGUMENTS = {"type": "object", "properties": {}}
_MODES: dict[int, ToolChoiceMode] = {
    pb.TOOL_CHOICE_MODE_NONE: "none",
    pb.TOOL_CHOICE_MODE_AUTO: "auto",
    pb.TOOL_CHOICE_MODE_REQUIRED: "required",
}


def checked_tools(
    chat: pb.Chat, settings: Settings, bad: Callable[[str, str], None]
) -> tuple[Tools | None, Constraint | None]:
    """The chat's tools (None: it has none and asks for no calls) and, where the choice forces
    calls, the constraint that does."""
    schemas = _tools(chat.tools, settings, bad)
    if schemas is None:
        return None, None
    choice = chat.tool_choice
    kind = choice.WhichOneof("choice")
    mode: ToolChoiceMode
    if kind == "function":
        if choice.function not in schemas:
            bad("chat.tool_choice.function", f"{choice.function[:64]!r} is not one of chat.tools")
            return None, None
        mode = "function"
    elif kind == "mode" and choice.mode != pb.TOOL_CHOICE_MODE_UNSPECIFIED:
        if choice.mode not in _MODES:
            bad("chat.tool_choice.mode", f"unknown value {choice.mode}")
            return None, None
        mode = _MODES[choice.mode]
    else:
        mode = "auto" if schemas else "none"
    tools = Tools(
        tuple(Tool(t.name, t.description, json.dumps(schemas[t.name])) for t in chat.tools),
        mode,
        choice.function if mode == "function" else "",
        parallel=not chat.HasField("parallel_tool_calls") or chat.parallel_tool_calls,
    )
    if tools.choice in ("required", "auto") and not tools.tools:
        bad("chat.tool_choice", f"{tools.choice!r} needs chat.tools")
        return None, None
    if not tools.tools and tools.choice == "none":
        return None, None
    try:
        schema = calls_schema(tools, schemas)
    except ValueError as error:
        bad("chat.tools", str(error))
        return None, None
    constraint = None
    if schema is not None:
        text = json.dumps(schema, separators=(",", ":"), ensure_ascii=False)
        constraint = Constraint("json_schema", text=text)
    return tools, constraint


def _tools(
    tools: Sequence[pb.Tool], settings: Settings, bad: Callable[[str, str], None]
) -> dict[str, dict[str, Any]] | None:
    """Each tool's parameters by name, parsed (None: a tool is refused)."""
    if len(tools) > settings.max_tools:
        # refused before any tool is read
        bad("chat.tools", f"{len(tools)} tools; the limit is {settings.max_tools}")
        return None
    chars = sum(len(t.name) + len(t.description) + len(t.parameters) for t in tools)
    if chars > settings.max_tools_chars:
        bad("chat.tools", f"{chars} characters; the limit is {settings.max_tools_chars}")
        return None
    schemas: dict[str, dict[str, Any]] = {}
    names: set[str] = set()
    for i, tool in enumerate(tools):
        where = f"chat.tools[{i}]"
        if not TOOL_NAME.fullmatch(tool.name):
            bad(f"{where}.name", "1 to 64 letters, digits, '_' and '-'")
            continue
        if tool.name in names:
            bad(f"{where}.name", f"{tool.name!r} names two tools")
            continue
        names.add(tool.name)
        schema = _parameters(tool.parameters, f"{where}.parameters", settings, bad)
        if schema is not None:
            schemas[tool.name] = schema
    return schemas if len(schemas) == len(tools) else None


def _parameters(
    text: str, where: str, settings: Settings, bad: Callable[[str, str], None]
) -> dict[str, Any] | None:
    if not text.strip():
        return dict(_NO_ARGUMENTS)
    schema = checked_schema(text, where, settings.max_constraint_depth, bad)
    if schema is None:
        return None
    if schema.get("type") != "object":
        bad(where, 'must be an object schema ("type": "object"): arguments are a JSON object')
        return None
    if (problem := schema_problem(schema)) is not None:
        bad(where, problem)
        return None
    return schema


def tool_turn_fields(
    messages: Sequence[pb.ChatMessage], settings: Settings, bad: Callable[[str, str], None]
) -> list[tuple[str, tuple[ToolCall, ...]]]:
    """Each message's tool_call_id and calls, checked: a call's id unique and its arguments a
    JSON object; a "tool" turn answering a call an earlier turn made; an assistant's alone
    making calls."""
    count = sum(len(message.tool_calls) for message in messages)
    if count > settings.max_tool_calls:
        # counted before any call is read: a million empty calls fit in a 4 MiB message
        bad("chat.messages", f"{count} tool calls; the limit is {settings.max_tool_calls}")
        return [("", ())] * len(messages)
    made: set[str] = set()
    fields: list[tuple[str, tuple[ToolCall, ...]]] = []
    for i, message in enumerate(messages):
        where = f"chat.messages[{i}]"
        calls: list[ToolCall] = []
        if message.tool_calls and message.role != "assistant":
            bad(f"{where}.tool_calls", "only an assistant turn makes calls")
        for j, call in enumerate(message.tool_calls):
            at = f"{where}.tool_calls[{j}]"
            if not CALL_ID.fullmatch(call.id):
                bad(f"{at}.id", "1 to 128 letters, digits and ._:-")
            elif call.id in made:
                bad(f"{at}.id", f"{call.id!r} names two calls")
            if not TOOL_NAME.fullmatch(call.name):
                bad(f"{at}.name", "1 to 64 letters, digits, '_' and '-'")
            arguments = _arguments(call.arguments)
            if arguments is None:
                bad(f"{at}.arguments", "must be a JSON object")
            made.add(call.id)
            calls.append(ToolCall(call.id, call.name, arguments or "{}"))
        if message.role == "tool":
            if not message.tool_call_id:
                bad(f"{where}.tool_call_id", "a tool turn names the call it answers")
            elif message.tool_call_id not in made:
                bad(
                    f"{where}.tool_call_id",
                    f"{message.tool_call_id[:128]!r} answers no earlier call",
                )
        elif message.tool_call_id:
            bad(f"{where}.tool_call_id", "only a tool turn answers a call")
        fields.append((message.tool_call_id, tuple(calls)))
    return fields


def _arguments(text: str) -> str | None:
    """A call's arguments as compact JSON; None: not a JSON object."""
    try:
        value = json.loads(text or "{}")
    except (ValueError, RecursionError):
        return None
    if not isinstance(value, dict):
        return None
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


__all__ = ["CALL_ID", "TOOL_NAME", "checked_tools", "tool_turn_fields"]
