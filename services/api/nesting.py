"""How deep an output constraint nests, measured before any native compiler sees it.

    json_schema ─ parsed ─▶ its objects and arrays, and every regex inside it ("pattern",
                            "patternProperties"' names) ─▶ depth
    regex       ─▶ groups and character classes ─▶ depth
    grammar     ─▶ parentheses, brackets and braces outside quoted literals ─▶ depth

The engine's grammar compilers recurse once a level: a regex of 30,000 nested groups, 60 KB and
under the constraint's size limit, overflowed xgrammar's native stack and killed the whole server
(SIGSEGV), where depth 20,000 compiled. Depth is therefore refused here, far below any stack's
reach; the scans are linear and never recurse deeper than the limit they check.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Final

# the keywords whose values are regular expressions (JSON Schema 2020-12)
_REGEX_KEYWORDS: Final = frozenset({"pattern"})
_REGEX_KEYS_OF: Final = frozenset({"patternProperties"})


def regex_depth(pattern: str) -> int:
    """The deepest nesting of groups in a regex; a character class counts one level, its
    contents none, and an escaped character is a literal."""
    depth = deepest = 0
    in_class = escaped = False
    for char in pattern:
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif in_class:
            in_class = char != "]"
        elif char == "[":
            in_class = True
            deepest = max(deepest, depth + 1)
        elif char == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif char == ")":
            depth = max(depth - 1, 0)
    return deepest


def grammar_depth(grammar: str) -> int:
    """The deepest nesting of brackets in a grammar (EBNF or Lark), outside quoted literals."""
    depth = deepest = 0
    quote: str | None = None
    escaped = False
    for char in grammar:
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif quote is not None:
            if char == quote:
                quote = None
        elif char in "\"'":
            quote = char
        elif char in "([{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in ")]}":
            depth = max(depth - 1, 0)
    return deepest


def schema_depth(schema: Any, limit: int) -> int:
    """The deepest nesting in a parsed JSON schema: its objects and arrays, plus the depth of
    any regex it holds at the level it holds it. Stops counting past ``limit``."""
    deepest = 0
    pending: list[tuple[Any, int]] = [(schema, 1)]
    while pending:
        value, depth = pending.pop()
        deepest = max(deepest, depth)
        if deepest > limit:
            return deepest
        for regex in _regexes(value):
            deepest = max(deepest, depth + regex_depth(regex))
        if isinstance(value, dict):
            pending.extend((child, depth + 1) for child in value.values())
        elif isinstance(value, list):
            pending.extend((child, depth + 1) for child in value)
    return deepest


def _regexes(value: Any) -> Iterator[str]:
    if not isinstance(value, dict):
        return
    for keyword, inner in value.items():
        if keyword in _REGEX_KEYWORDS and isinstance(inner, str):
            yield inner
        elif keyword in _REGEX_KEYS_OF and isinstance(inner, dict):
            yield from (name for name in inner if isinstance(name, str))


__all__ = ["grammar_depth", "regex_depth", "schema_depth"]
