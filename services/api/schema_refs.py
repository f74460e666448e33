"""Whether a JSON schema's ``$ref``s let any finite value match it.

A schema that refers to itself with nothing in between (``{"$ref": "#"}``, two definitions that
name each other) or through a property it requires (``{"properties": {"next": {"$ref": "#"}},
"required": ["next"]}``) compiles to a grammar no finite text completes: the engine accepts the
request, rejects every token, and the call ended with no text and no reason. Such a schema is
refused here instead. Recursion with a way out (an optional property, an array that may be empty,
an alternative that stops) is a schema like any other.

The check is the least fixed point of "this schema can end": a schema is assumed not to end
while it is being decided, and a result reached under that assumption is kept only where it
cannot change (a schema that ends, ends).
"""

from __future__ import annotations

from typing import Any, Final, final

# work allowed for one schema: past it the schema is left to the engine (never refused on a guess)
_MAX_STEPS: Final = 100_000


@final
class _Decider:
    __slots__ = ("ends", "root", "steps", "undecided")

    def __init__(self, root: Any) -> None:
        self.root = root
        self.ends: set[int] = set()
        self.undecided: set[int] = set()
        self.steps = 0

    def can_end(self, schema: Any) -> bool:
        self.steps += 1
        if self.steps > _MAX_STEPS:
            raise _GaveUp
        if not isinstance(schema, dict):
            return True  # true, false or something the engine judges
        key = id(schema)
        if key in self.ends:
            return True
        if key in self.undecided:
            return False  # assumed while being decided (the least fixed point)
        self.undecided.add(key)
        try:
            result = self._decide(schema)
        finally:
            self.undecided.discard(key)
        if result:
            self.ends.add(key)
        return result

    def _decide(self, schema: dict[str, Any]) -> bool:
        ref = schema.get("$ref")
        if isinstance(ref, str):
            target = _resolve(self.root, ref)
            if target is not _UNKNOWN and not self.can_end(target):
                return False
        for keyword in ("anyOf", "oneOf"):
            branches = schema.get(keyword)
            alternatives = branches if isinstance(branches, list) and branches else [True]
            if not any(self.can_end(branch) for branch in alternatives):
                return False
        branches = schema.get("allOf")
        if isinstance(branches, list) and not all(self.can_end(b) for b in branches):
            return False
        properties = schema.get("properties")
        required = schema.get("required")
        if isinstance(properties, dict) and isinstance(required, list):
            for name in required:
                if isinstance(name, str) and not self.can_end(properties.get(name)):
                    return False
        items, least = schema.get("items"), schema.get("minItems", 0)
        return not (isinstance(least, int) and least > 0) or self.can_end(items)


class _GaveUp(Exception):
    pass


_UNKNOWN: Final = object()


def _resolve(root: Any, ref: str) -> Any:
    """A local reference's target ("#", "#/$defs/name", a JSON pointer); anything else is
    unknown here."""
    if not ref.startswith("#"):
        return _UNKNOWN
    node = root
    for part in ref[1:].split("/")[1:] if ref != "#" else ():
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return _UNKNOWN
    return node


def refs_can_end(schema: Any) -> bool:
    """False only where the schema's references certainly leave no finite value to match."""
    try:
        return _Decider(schema).can_end(schema)
    except (_GaveUp, RecursionError):  # a chain of references longer than the check goes
        return True


__all__ = ["refs_can_end"]
