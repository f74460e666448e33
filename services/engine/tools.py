"""vLLM's side of tool calls: the schema that forces calls, the parser that reads them.

vLLM is imported where it is used: the API layer imports this module, and a server that stops
at its settings must not have loaded vLLM first.

    Tools, choice "required" or a function ─ calls_schema ─▶ a JSON Schema for the engine's
        structured output (vLLM's server builds the same): an array of {name, parameters}, or
        the named function's arguments
    a sample's text, choice "auto" ─ AutoCalls.read ─▶ the text outside the calls, the calls
        as the model wrote them (vLLM's tool parser of the setting's name)

What the calls' arguments must be (valid against their function's schema) is checked above this,
in services/pipeline/tool_calls.py: a parser's word is not trusted.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from typing import Any, final

from ..tool_types import Tools


def _vllm_tools(tools: Tools, schemas: dict[str, dict[str, Any]]) -> list[Any]:
    from vllm.entrypoints.generate.base.protocol import FunctionDefinition
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionToolsParam

    return [
        ChatCompletionToolsParam(
            function=FunctionDefinition(
                name=tool.name,
                description=tool.description or None,
                parameters=schemas[tool.name],
            )
        )
        for tool in tools.tools
    ]


def calls_schema(tools: Tools, schemas: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """The JSON Schema that constrained decoding keeps the answer to (None: no constraint, for
    "auto" and "none"); ``schemas``: each tool's parameters, parsed. ValueError: vLLM cannot
    build one from these tools (two tools defining one $defs name differently)."""
    from vllm.entrypoints.openai.chat_completion.protocol import (
        ChatCompletionNamedFunction,
        ChatCompletionNamedToolChoiceParam,
    )
    from vllm.tool_parsers.utils import get_json_schema_from_tools

    choice: Any
    if tools.choice == "required":
        choice = "required"
    elif tools.choice == "function":
        choice = ChatCompletionNamedToolChoiceParam(
            function=ChatCompletionNamedFunction(name=tools.function)
        )
    else:
        return None
    schema = get_json_schema_from_tools(
        tool_choice=choice, tools=_vllm_tools(tools, schemas), parallel_tool_calls=tools.parallel
    )
    assert isinstance(schema, dict)
    return schema


def call_id() -> str:
    """A call's id, as vLLM's server makes them."""
    from vllm.renderers.chat_utils import make_tool_call_id

    return str(make_tool_call_id())


@final
class AutoCalls:
    """vLLM's tool parser of one name, reading the calls out of an "auto" answer."""

    __slots__ = ("_parser", "_request", "end_token")

    def __init__(self, name: str, tokenizer: Any) -> None:
        """KeyError: vLLM has no tool parser of that name."""
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
        from vllm.tool_parsers import ToolParserManager

        self._parser = ToolParserManager.get_tool_parser(name)(tokenizer)
        # what ends a call in the parser's format ("</tool_call>"), where it has one: a stream
        # hands out each call once this follows it
        end = getattr(self._parser, "tool_call_end_token", None)
        self.end_token: str | None = end if isinstance(end, str) and end else None
        # the parsers read their options from an OpenAI request; one without tools is enough
        self._request = ChatCompletionRequest(messages=[], model="mmgate")

    def read(self, text: str) -> tuple[str, list[tuple[str, Any]]] | None:
        """The text outside the calls and each call's (name, arguments) as the model wrote
        them; None: the text holds no calls. ValueError: it begins one the parser cannot
        read (cut short, or not JSON)."""
        # vLLM's parsers log a stack trace for output they cannot read: an answer's content,
        # not a fault of the server's
        with _quiet(self._parser.__module__):
            extracted = self._parser.extract_tool_calls(text, self._request)
        if not extracted.tools_called:
            start = getattr(self._parser, "tool_call_start_token", None)
            if isinstance(start, str) and start and start in text:
                raise ValueError("the output begins a call that could not be read")
            return None
        calls = [(call.function.name, call.function.arguments) for call in extracted.tool_calls]
        return extracted.content or "", calls


@final
class _Reading(logging.Filter):
    """Drops a parser's records in a thread while it reads an answer there; other threads,
    and the parser outside a read, log as ever (a logger's level is the whole process's: two
    reads at once saved and restored each other's, and left the logger silenced)."""

    def __init__(self) -> None:
        super().__init__()
        self.local = threading.local()

    def filter(self, record: logging.LogRecord) -> bool:
        return not getattr(self.local, "reading", False)


_READING = _Reading()


@contextlib.contextmanager
def _quiet(name: str) -> Iterator[None]:
    logger = logging.getLogger(name)
    if _READING not in logger.filters:
        logger.addFilter(_READING)
    _READING.local.reading = True
    try:
        yield
    finally:
        _READING.local.reading = False


def template_takes_tools(template: Any) -> bool:
    """Whether a model's chat template renders the tools it is given (it reads ``tools``)."""
    if isinstance(template, dict):  # named templates: the default one, or any "tool_use"
        return "tool_use" in template or template_takes_tools(template.get("default"))
    return isinstance(template, str) and "tools" in template


def has_tool_parser(name: str) -> bool:
    from vllm.tool_parsers import ToolParserManager

    try:
        ToolParserManager.get_tool_parser(name)
    except KeyError:
        return False
    return True


__all__ = ["AutoCalls", "call_id", "calls_schema", "has_tool_parser", "template_takes_tools"]
