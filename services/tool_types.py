"""A chat's tools and the calls made with them, as the request and the pipeline carry them
(no proto here: services/api/tools.py makes these of the request's fields)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, final


@final
@dataclass(frozen=True, slots=True)
class ToolCall:
    """A function call: made by the model (read from its output) or sent back in a chat."""

    id: str
    name: str
    arguments: str  # a JSON object, as text


@final
@dataclass(frozen=True, slots=True)
class Tool:
    """A function the model may call; ``parameters``: its arguments' JSON Schema, compact."""

    name: str
    description: str
    parameters: str


ToolChoiceMode = Literal["none", "auto", "required", "function"]


@final
@dataclass(frozen=True, slots=True)
class Tools:
    """A chat's tools and what the answer may do with them (``function``: the one to call)."""

    tools: tuple[Tool, ...]
    choice: ToolChoiceMode
    function: str = ""
    parallel: bool = True

    def named(self, name: str) -> Tool | None:
        return next((tool for tool in self.tools if tool.name == name), None)


__all__ = ["Tool", "ToolCall", "ToolChoiceMode", "Tools"]
