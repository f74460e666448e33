"""Cache keys: content digests of what changes a value, the same on every replica.

cache_key(model, stage, payload) = sha256(canonical JSON of [model, stage, payload]), in hex
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Final

_HEX: Final = frozenset("0123456789abcdef")
# Longest key a client may name (Cache.Inspect, Cache.Invalidate): a SHA-256 digest is 64.
MAX_KEY_CHARS: Final = 128


def cache_key(model: str, stage: str, payload: Any) -> str:
    """A content digest: the same model, stage and input give the same key, on every replica."""
    canonical = json.dumps([model, stage, payload], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def is_hex_key(key: str) -> bool:
    """A cache key as mmgate makes them: lowercase hex digits, at most MAX_KEY_CHARS."""
    return 1 <= len(key) <= MAX_KEY_CHARS and set(key) <= _HEX


__all__ = ["MAX_KEY_CHARS", "cache_key", "is_hex_key"]
