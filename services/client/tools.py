"""Tools for a chat: a Python function's signature as a Tool, and a chat's tool choice.

    def get_weather(city: str, days: int = 1) -> str:
        \"\"\"The weather in a city.\"\"\"
    tool_from_function(get_weather)
        ─▶ Tool(name="get_weather", description="The weather in a city.",
                parameters={"type": "object", "properties": {"city": {"type": "string"},
                            "days": {"type": "integer", "default": 1}}, "required": ["city"]})

The client imports nothing beyond grpc and protobuf, so the schema is read from the annotations
here: str, int, float, bool, None, list[...], dict[str, ...], Literal[...], X | None; anything
else is left open ({}), for the model to fill and the server to check against nothing more.
"""

from __future__ import annotations

import inspect
import json
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..proto.mmgate.v1 import inference_pb2

_SIMPLE: dict[Any, str] = {
    str: "string",
    int: "integer",
    float: "number",
    bool: "boolean",
    type(None): "null",
}
_MODES = {
    "none": inference_pb2.TOOL_CHOICE_MODE_NONE,
    "auto": inference_pb2.TOOL_CHOICE_MODE_AUTO,
    "required": inference_pb2.TOOL_CHOICE_MODE_REQUIRED,
}

ToolLike = inference_pb2.Tool | Callable[..., Any] | Mapping[str, Any]


def _schema_of(annotation: Any) -> dict[str, Any]:
    if annotation in _SIMPLE:
        return {"type": _SIMPLE[annotation]}
    origin, arguments = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return {"enum": list(arguments)}
    if origin in (list, tuple, Sequence) and arguments:
        return {"type": "array", "items": _schema_of(arguments[0])}
    if origin in (dict, Mapping) and len(arguments) == 2:
        return {"type": "object", "additionalProperties": _schema_of(arguments[1])}
    if origin in (typing.Union, types.UnionType):
        return {"anyOf": [_schema_of(argument) for argument in arguments]}
    return {}


def tool_from_function(function: Callable[..., Any]) -> inference_pb2.Tool:
    """A Tool of ``function``: its name, its docstring's first paragraph, and its parameters'
    JSON Schema from their annotations and defaults."""
    hints = typing.get_type_hints(function)
    properties: dict[str, Any] = {}
    required: list[str] = []
    for name, parameter in inspect.signature(function).parameters.items():
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        schema = _schema_of(hints.get(name, Any))
        if parameter.default is parameter.empty:
            required.append(name)
        else:
            schema["default"] = parameter.default
        properties[name] = schema
    description = (inspect.getdoc(function) or "").split("\n\n")[0].strip()
    parameters = {"type": "object", "properties": properties, "required": required}
    return inference_pb2.Tool(
        name=function.__name__, description=description, parameters=json.dumps(parameters)
    )


def as_tool(tool: ToolLike) -> inference_pb2.Tool:
    """A Tool as it is, a function's (tool_from_function), or one of a mapping's name,
    description and parameters (a dict, or JSON text)."""
    if isinstance(tool, inference_pb2.Tool):
        return tool
    if isinstance(tool, Mapping):
        parameters = tool.get("parameters", "")
        if not isinstance(parameters, str):
            parameters = json.dumps(parameters)
        return inference_pb2.Tool(
            name=tool["name"], description=tool.get("description", ""), parameters=parameters
        )
    return tool_from_function(tool)


def tool_choice(choice: str) -> inference_pb2.ToolChoice:
    """ "none", "auto", "required", or the name of the one function to call."""
    if choice in _MODES:
        return inference_pb2.ToolChoice(mode=_MODES[choice])
    return inference_pb2.ToolChoice(function=choice)


def tool_result(call_id: str, result: Any) -> inference_pb2.ChatMessage:
    """A "tool" turn: the result of the call ``call_id`` (text as it is, else as JSON)."""
    content = result if isinstance(result, str) else json.dumps(result)
    return inference_pb2.ChatMessage(role="tool", content=content, tool_call_id=call_id)


def calls_turn(
    calls: Sequence[inference_pb2.ToolCall], content: str = ""
) -> inference_pb2.ChatMessage:
    """The assistant turn that made ``calls`` (an answer's SampleEnd.tool_calls), to send back
    before their results."""
    return inference_pb2.ChatMessage(role="assistant", content=content, tool_calls=calls)


__all__ = ["ToolLike", "as_tool", "calls_turn", "tool_choice", "tool_from_function", "tool_result"]
