"""The caller a service-mesh sidecar vouches for, from Envoy's x-forwarded-client-cert.

    x-forwarded-client-cert: By=spiffe://cluster.local/ns/ml/sa/mmgate;Hash=...;
                             Subject="";URI=spiffe://cluster.local/ns/apps/sa/frontend

Each proxy on the way appends one element (comma-separated); the last is the sidecar's own, whose
URI is the SPIFFE identity of the workload that opened the mTLS connection. The header is only as
true as the sidecar in front of mmgate: docs/security.md says when it can be trusted.
"""

from __future__ import annotations

from typing import Final

XFCC_HEADER: Final = "x-forwarded-client-cert"


def _split(text: str, separator: str) -> list[str]:
    """Split on ``separator`` outside double quotes (a Subject may hold commas)."""
    parts, current, quoted, escaped = [], [], False, False
    for char in text:
        if escaped:
            current.append(char)
            escaped = False
        elif char == "\\":
            current.append(char)
            escaped = True
        elif char == '"':
            current.append(char)
            quoted = not quoted
        elif char == separator and not quoted:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return parts


def forwarded_identity(header: str) -> str | None:
    """The URI (SPIFFE ID) of the element the nearest proxy added, or None."""
    elements = [e for e in _split(header, ",") if e.strip()]
    if not elements:
        return None
    for pair in _split(elements[-1], ";"):
        name, _, value = pair.strip().partition("=")
        if name.lower() == "uri" and value:
            return value.strip('"') or None
    return None


__all__ = ["XFCC_HEADER", "forwarded_identity"]
