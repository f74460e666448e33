"""A request's output constraint, checked before the engine compiles it: bounded in size and in
nesting (nesting.py), a JSON schema parsed, compacted and required to let some finite value
match (schema_refs.py); what the constraint means is the engine's backend to judge."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from ..config import Settings
from ..proto.mmgate.v1 import inference_pb2 as pb
from ..types import Constraint
from .nesting import grammar_depth, regex_depth, schema_depth
from .schema_refs import refs_can_end


def checked_constraint(
    s: pb.SamplingParams, settings: Settings, bad: Callable[[str, str], None]
) -> Constraint | None:
    """The output constraint, bounded in size; the engine's backend checks what it means."""
    kind = s.WhichOneof("constraint")
    if kind is None:
        return None
    where, limit = f"sampling.{kind}", settings.max_constraint_chars
    if kind == "json_object":
        if not s.json_object:
            bad(where, "must be true when set; leave the constraint unset for free text")
        return Constraint("json_object")
    if kind == "choice":
        count = len(s.choice.choices)
        if count > settings.max_choices:
            bad(f"{where}.choices", f"{count} strings; the limit is {settings.max_choices}")
            return Constraint("choice", choices=())
        choices = tuple(s.choice.choices)
        chars = sum(map(len, choices))
        if not choices:
            bad(f"{where}.choices", "must hold at least one string")
        elif chars > limit:
            bad(f"{where}.choices", f"{chars} characters; the limit is {limit}")
        elif not all(choices):
            bad(f"{where}.choices", "must not hold an empty string")
        return Constraint("choice", choices=choices)
    text: str = getattr(s, kind)
    if not text.strip():
        bad(where, "must not be empty")
    elif len(text) > limit:
        bad(where, f"{len(text)} characters; the limit is {limit}")
    elif "\x00" in text:
        bad(where, "must not hold a NUL character")
    elif kind == "json_schema":
        text = _compact_schema(text, where, settings.max_constraint_depth, bad)
    elif (depth := _DEPTH_OF[kind](text)) > settings.max_constraint_depth:
        bad(where, f"nests {depth} levels deep; the limit is {settings.max_constraint_depth}")
    return Constraint(kind, text=text)


_DEPTH_OF: dict[str, Callable[[str], int]] = {"regex": regex_depth, "grammar": grammar_depth}


def _compact_schema(text: str, where: str, max_depth: int, bad: Callable[[str, str], None]) -> str:
    """The schema as compact JSON (one run for the same schema however it is spaced); the order
    of its keys stays, since it is the order of the output's properties."""
    schema = checked_schema(text, where, max_depth, bad)
    if schema is None:
        return text
    return json.dumps(schema, separators=(",", ":"), ensure_ascii=False)


def checked_schema(
    text: str, where: str, max_depth: int, bad: Callable[[str, str], None]
) -> dict[str, Any] | None:
    """A JSON Schema's text parsed, within the nesting limit, with some finite value matching
    it; None where it is not (``bad`` was told why)."""
    try:
        schema = json.loads(text)
    except RecursionError:
        bad(where, "is nested too deeply")
        return None
    except ValueError as error:
        bad(where, f"is not JSON: {error}")
        return None
    if not isinstance(schema, dict):
        bad(where, "must be a JSON object (a JSON Schema)")
        return None
    if (depth := schema_depth(schema, max_depth)) > max_depth:
        bad(where, f"nests {depth} levels deep, its patterns included; the limit is {max_depth}")
        return None
    if not refs_can_end(schema):
        bad(where, "refers to itself with no way to end: no finite value matches it")
        return None
    return schema


__all__ = ["checked_constraint", "checked_schema"]
