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

import functools
import json
import math
import time
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, final

import jsonschema
import regex
from jsonschema import ValidationError

from ..engine.tools import AutoCalls, call_id
from ..tool_types import Tool, ToolCall, Tools
from .threads import ThreadPools

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


def _checked(tools: Tools, name: Any, arguments: Any, made: str | None = None) -> ToolCall:
    """A call to one of ``tools`` whose arguments validate, its id ``made`` (None: a new one).
    ValueError: why not."""
    tool = tools.named(name) if isinstance(name, str) else None
    if tool is None:
        raise ValueError(f"a call to {str(name)[:64]!r}, which is not one of the tools")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError):
            raise ValueError(f"{tool.name}'s arguments are not JSON") from None
    if not isinstance(arguments, dict):
        raise ValueError(f"{tool.name}'s arguments are not a JSON object")
    problem = _argument_problem(tool, arguments)
    if problem is not None:
        raise ValueError(f"{tool.name}'s arguments do not validate: {problem}")
    return ToolCall(made or call_id(), tool.name, json.dumps(arguments, ensure_ascii=False))


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
    tools: Tools,
    text: str,
    finish_reason: str | None,
    auto: AutoCalls | None,
    *,
    ids: Sequence[str] = (),
    final: bool = True,
) -> ToolReading:
    """A sample's calls and the rest of its text, as its tool choice says to read them; the
    schemas' patterns matched within READ_SECONDS in all. ``ids``: those of the calls already
    handed out, kept for them. Not ``final``: the output so far, its calls complete by now."""
    deadline = _DEADLINE.set(time.monotonic() + READ_SECONDS)
    try:
        return _read_calls(tools, text, finish_reason, auto, list(ids), final)
    finally:
        _DEADLINE.reset(deadline)


def read_all(
    tools: Tools,
    outputs: list[tuple[str, str | None, tuple[str, ...]]],
    auto: AutoCalls | None,
) -> list[ToolReading]:
    """Each sample's final reading, of its (text, finish reason, ids of calls handed out)."""
    return [read_calls(tools, text, end, auto, ids=ids) for text, end, ids in outputs]


def _read_calls(
    tools: Tools,
    text: str,
    finish_reason: str | None,
    auto: AutoCalls | None,
    ids: list[str],
    final: bool,
) -> ToolReading:
    if tools.choice == "none" or (tools.choice == "auto" and auto is None):
        return ToolReading(text)
    content: str | None = None
    written: list[tuple[Any, Any]]
    problem = ""
    try:
        if tools.choice == "auto":
            assert auto is not None
            found = auto.read(text)
            if found is None:
                return ToolReading(text)
            content, written = found[0] or None, found[1]
        elif tools.choice == "function":
            value, closed = _json_value(text)
            if not closed:
                return _unfinished(text, finish_reason, final)
            written = [(tools.function, value)]
        else:
            values, closed = _json_list(text)
            written = [
                (v.get("name"), v.get("parameters")) if isinstance(v, dict) else (None, None)
                for v in values
            ]
            if not closed and final:
                problem = _unfinished(text, finish_reason, final).error
            elif closed and not values:
                problem = "the output is not a list of calls"
    except ValueError as error:
        return ToolReading(text, (), str(error))
    calls: list[ToolCall] = []
    for name, arguments in written:
        try:
            kept = ids[len(calls)] if len(calls) < len(ids) else None
            calls.append(_checked(tools, name, arguments, kept))
        except ValueError as error:
            # each call on its own: those before it stand, none after it is handed out
            problem = str(error)
            break
    if not calls:
        return ToolReading(text, (), problem)
    return ToolReading(content, tuple(calls), problem)


def _unfinished(text: str, finish_reason: str | None, final: bool) -> ToolReading:
    if not final:
        return ToolReading(text)
    ended = " (it ended at max_tokens)" if finish_reason == "length" else ""
    return ToolReading(text, (), f"the output is not the calls' JSON{ended}")


_DECODER = json.JSONDecoder()


def _json_value(text: str) -> tuple[Any, bool]:
    """The JSON value the text is, and whether it is one (whole, and nested within reason)."""
    try:
        return json.loads(text), True
    except (ValueError, RecursionError):
        return None, False


def _json_list(text: str) -> tuple[list[Any], bool]:
    """The elements of the JSON list the text begins that are whole by now, and whether the
    list is closed. ValueError: the text is no JSON list."""
    at = _skip(text, 0)
    if at == len(text):
        return [], False
    if text[at] != "[":
        raise ValueError("the output is not a list of calls")
    values: list[Any] = []
    at = _skip(text, at + 1)
    while at < len(text):
        if text[at] == "]":
            if _skip(text, at + 1) != len(text):
                raise ValueError("the output is not the calls' JSON")
            return values, True
        try:
            value, at = _DECODER.raw_decode(text, at)
        except RecursionError:
            raise ValueError("the output is not the calls' JSON") from None
        except ValueError:
            return values, False  # an element not whole yet
        values.append(value)
        at = _skip(text, at)
        if at < len(text) and text[at] == ",":
            at = _skip(text, at + 1)
    return values, False


def _skip(text: str, at: int) -> int:
    while at < len(text) and text[at] in " \t\r\n":
        at += 1
    return at


@final
class CallStreams:
    """Each sample's calls handed out as a stream goes, each whole and checked as soon as the
    model has written it (a caller never acts on part of a call), its id kept for the end."""

    __slots__ = ("_ends_seen", "auto", "ids", "threads", "tools")

    def __init__(
        self, tools: Tools, auto: AutoCalls | None, samples: int, threads: ThreadPools
    ) -> None:
        self.tools = tools
        self.auto = auto
        self.threads = threads
        self.ids: list[list[str]] = [[] for _ in range(samples)]  # the calls handed out
        self._ends_seen = [0] * samples

    async def made(self, index: int, whole: Callable[[], str], delta: str) -> tuple[ToolCall, ...]:
        """The calls sample ``index`` has completed with ``delta`` (``whole()``: all of its
        output so far, read only where a call may have ended), checked in a worker thread."""
        prefix = self._complete_part(index, whole, delta)
        if prefix is None:
            return ()
        read = functools.partial(
            read_calls, self.tools, prefix, None, self.auto, ids=self.ids[index], final=False
        )
        reading = await self.threads.run("render", read)
        new = reading.calls[len(self.ids[index]) :]
        self.ids[index].extend(call.id for call in new)
        return new

    def _complete_part(self, index: int, whole: Callable[[], str], delta: str) -> str | None:
        """The output up to its last call's end, where ``delta`` may have ended one."""
        if self.tools.choice in ("required", "function"):
            return whole() if "}" in delta else None
        end = self.auto.end_token if self.tools.choice == "auto" and self.auto else None
        if end is None or end[-1] not in delta:
            return None
        text = whole()
        ends = text.count(end)
        if ends <= self._ends_seen[index]:
            return None
        self._ends_seen[index] = ends
        return text[: text.rfind(end) + len(end)]


__all__ = [
    "PATTERN_SECONDS",
    "READ_SECONDS",
    "CallStreams",
    "ToolReading",
    "read_all",
    "read_calls",
    "schema_problem",
]
