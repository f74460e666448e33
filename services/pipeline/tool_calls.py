"""A sample's tool calls, read from its text and checked before any is handed out.

    the sample's whole text ─ tool choice ─┬ "required": a JSON array of {name, parameters}
                                           ├ a function: that function's arguments, JSON
                                           ├ "auto": the calls vLLM's tool parser finds
                                           └ "none": text
        ─▶ each call: a function of the request's, arguments a JSON object valid against its
           parameters (jsonschema) ─▶ ToolReading(content, calls) or, for output that looked
           like calls and is not, the whole text as text and the reason

Constrained decoding makes "required" and named calls valid as the model writes them; "auto"
output is whatever the model wrote. Either way no call leaves mmgate unchecked: a caller
executes what it is handed.

The schemas are the caller's: a ``pattern`` is matched with the ``regex`` module under a time
bound, and an answer's patterns under one together, so a pattern that backtracks without end
fails the call instead of holding a thread. The pipeline reads calls in a worker thread, never
on the event loop.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, final

import jsonschema
import regex
from jsonschema import ValidationError

from ..engine.tools import AutoCalls, call_id
from ..tool_types import Tool, ToolCall, Tools

# a caller's pattern matched against one string of an answer, at most, and all of an answer's
# patterns together: thousands of patterns in 64 KiB of schemas must not hold a thread for long
PATTERN_SECONDS = 0.05
READ_SECONDS = 0.25
_DEADLINE: ContextVar[float] = ContextVar("mmgate_tool_patterns_deadline", default=math.inf)


@final
@dataclass(frozen=True, slots=True)
class ToolReading:
    content: str | None  # the text outside the calls (None: none)
    calls: tuple[ToolCall, ...] = ()
    error: str = ""  # why text that looked like calls was handed back as text


def _search(pattern: str, text: str) -> bool:
    left = _DEADLINE.get() - time.monotonic()
    try:
        if left <= 0:
            raise TimeoutError
        return regex.search(pattern, text, timeout=min(PATTERN_SECONDS, left)) is not None
    except TimeoutError as error:
        raise ValidationError(f"pattern {pattern[:40]!r} took too long to match") from error


def _pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if validator.is_type(instance, "string") and not _search(pattern, instance):
        yield ValidationError(f"does not match {pattern[:40]!r}")


def _pattern_properties(
    validator: Any, patterns: dict[str, Any], instance: Any, schema: Any
) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for key, value in instance.items():
            if _search(pattern, key):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _additional_properties(
    validator: Any, additional: Any, instance: Any, schema: Any
) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    properties, patterns = schema.get("properties", {}), schema.get("patternProperties", {})
    extras = [
        key
        for key in instance
        if key not in properties and not any(_search(p, key) for p in patterns)
    ]
    if validator.is_type(additional, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], additional, path=extra)
    elif additional is False and extras:
        yield ValidationError(f"unexpected properties {', '.join(map(repr, sorted(extras)))}")


_Validator = jsonschema.validators.extend(  # type: ignore[no-untyped-call]
    jsonschema.Draft202012Validator,
    {
        "pattern": _pattern,
        "patternProperties": _pattern_properties,
        "additionalProperties": _additional_properties,
    },
)


def schema_problem(schema: dict[str, Any]) -> str | None:
    """Why ``schema`` is no JSON Schema (None: it is one)."""
    try:
        _Validator.check_schema(schema)
    except jsonschema.SchemaError as error:
        return f"is not a valid JSON Schema: {error.message[:120]}"
    return None


def _checked(tools: Tools, name: Any, arguments: Any) -> ToolCall:
    """A call to one of ``tools`` whose arguments validate. ValueError: why not."""
    tool = tools.named(name) if isinstance(name, str) else None
    if tool is None:
        raise ValueError(f"a call to {str(name)[:64]!r}, which is not one of the tools")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            raise ValueError(f"{tool.name}'s arguments are not JSON") from None
    if not isinstance(arguments, dict):
        raise ValueError(f"{tool.name}'s arguments are not a JSON object")
    problem = _argument_problem(tool, arguments)
    if problem is not None:
        raise ValueError(f"{tool.name}'s arguments do not validate: {problem}")
    return ToolCall(call_id(), tool.name, json.dumps(arguments, ensure_ascii=False))


def _argument_problem(tool: Tool, arguments: dict[str, Any]) -> str | None:
    schema = json.loads(tool.parameters)
    try:
        error = jsonschema.exceptions.best_match(_Validator(schema).iter_errors(arguments))
    except ValidationError as timed_out:  # a pattern past its time bound
        return timed_out.message
    if error is None:
        return None
    where = "/".join(map(str, error.absolute_path))
    return f"{where + ': ' if where else ''}{error.message[:160]}"


def read_calls(
    tools: Tools, text: str, finish_reason: str | None, auto: AutoCalls | None
) -> ToolReading:
    """A sample's calls and the rest of its text, as its tool choice says to read them; the
    schemas' patterns matched within READ_SECONDS in all."""
    deadline = _DEADLINE.set(time.monotonic() + READ_SECONDS)
    try:
        return _read_calls(tools, text, finish_reason, auto)
    finally:
        _DEADLINE.reset(deadline)


def read_all(
    tools: Tools, outputs: list[tuple[str, str | None]], auto: AutoCalls | None
) -> list[ToolReading]:
    """Each sample's reading, of its (text, finish reason)."""
    return [read_calls(tools, text, finish, auto) for text, finish in outputs]


def _read_calls(
    tools: Tools, text: str, finish_reason: str | None, auto: AutoCalls | None
) -> ToolReading:
    if tools.choice == "none":
        return ToolReading(text)
    try:
        if tools.choice == "auto":
            if auto is None:
                return ToolReading(text)
            found = auto.read(text)
            if found is None:
                return ToolReading(text)
            content, written = found
            calls = tuple(_checked(tools, name, arguments) for name, arguments in written)
            return ToolReading(content or None, calls)
        try:
            value = json.loads(text)
        except ValueError:
            ended = " (it ended at max_tokens)" if finish_reason == "length" else ""
            raise ValueError(f"the output is not the calls' JSON{ended}") from None
        if tools.choice == "function":
            return ToolReading(None, (_checked(tools, tools.function, value),))
        if not isinstance(value, list) or not value:
            raise ValueError("the output is not a list of calls")
        calls = tuple(
            _checked(tools, call.get("name"), call.get("parameters"))
            if isinstance(call, dict)
            else _checked(tools, None, None)
            for call in value
        )
        return ToolReading(None, calls)
    except ValueError as error:
        return ToolReading(text, (), str(error))


__all__ = [
    "PATTERN_SECONDS",
    "READ_SECONDS",
    "ToolReading",
    "read_all",
    "read_calls",
    "schema_problem",
]
