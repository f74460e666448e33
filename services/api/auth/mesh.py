"""The caller a service-mesh sidecar vouches for, from Envoy's x-forwarded-client-cert.

    peer ─▶ one of the sidecar's addresses? ─no─▶ refused (UNTRUSTED_PEER)
      │yes
    x-forwarded-client-cert: By=spiffe://cluster.local/ns/ml/sa/mmgate;Hash=...;
                             Subject="";URI=spiffe://cluster.local/ns/apps/sa/frontend
      ─▶ parsed strictly ─▶ the last element (the sidecar's own) ─▶ its URI

The header is only as true as the connection it came on: only the sidecar may set it, so it is
believed only from the addresses the sidecar connects from (``SidecarPeers``; Istio's REDIRECT
mode: 127.0.0.6 and ::6). That stops callers outside the pod; a process inside the pod's
network namespace can bind those addresses too (docs/security.md).

The header is parsed as Envoy writes it, and anything else is refused rather than guessed at:
keys By, Hash, Cert, Chain, Subject, URI and DNS in Envoy's case, values bare or in double
quotes, elements separated by commas, pairs by semicolons. Each proxy on the way appends one
element (APPEND_FORWARD, Istio's sidecar default); the last is the sidecar's own and must carry
By= and Hash=, which the sidecar always writes. Where the sidecar sanitises (SANITIZE_SET), its
element is the only one. Two headers on one call are refused: which one the sidecar wrote is
not for mmgate to pick.
"""

from __future__ import annotations

import ipaddress
import urllib.parse
from collections.abc import Iterable
from typing import Final, final

XFCC_HEADER: Final = "x-forwarded-client-cert"
# Envoy's keys, in Envoy's case (source/common/http/conn_manager_utility.cc)
_KEYS: Final = frozenset({"By", "Hash", "Cert", "Chain", "Subject", "URI", "DNS"})
# keys that may appear more than once in an element (a certificate has several DNS SANs)
_REPEATABLE: Final = frozenset({"DNS"})

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


class MalformedHeader(ValueError):
    """An x-forwarded-client-cert that is not one the sidecar wrote; the message says why."""


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
    if quoted or escaped:
        raise MalformedHeader("an unterminated quoted value")
    parts.append("".join(current))
    return parts


def _value(raw: str) -> str:
    if raw.startswith('"'):
        if len(raw) < 2 or not raw.endswith('"'):
            raise MalformedHeader("a value with text after its closing quote")
        return raw[1:-1].replace('\\"', '"').replace("\\\\", "\\")
    if '"' in raw or "\\" in raw:
        raise MalformedHeader("a quote inside an unquoted value")
    return raw


def _parse_element(element: str) -> dict[str, list[str]]:
    """One element's pairs, by key; raises MalformedHeader."""
    pairs: dict[str, list[str]] = {}
    for pair in _split(element, ";"):
        key, equals, raw = pair.partition("=")
        if not equals:
            raise MalformedHeader("a pair without '='")
        if key not in _KEYS:
            raise MalformedHeader(f"an unknown key {key[:16]!r} (keys are Envoy's, in its case)")
        if key in pairs and key not in _REPEATABLE:
            raise MalformedHeader(f"{key} twice in one element")
        pairs.setdefault(key, []).append(_value(raw))
    return pairs


def forwarded_identity(values: Iterable[str], *, sanitized: bool = False) -> str | None:
    """The URI (SPIFFE ID) in the sidecar's own element of the call's x-forwarded-client-cert
    values; None where that element names no URI. Raises MalformedHeader for anything the
    sidecar would not have written."""
    headers = list(values)
    if not headers:
        return None
    if len(headers) > 1:
        raise MalformedHeader("more than one x-forwarded-client-cert header")
    elements = _split(headers[0], ",")
    if any(not e for e in elements):
        raise MalformedHeader("an empty element")
    if sanitized and len(elements) > 1:
        raise MalformedHeader("elements before the sidecar's own, which sanitises the header")
    parsed = [_parse_element(e) for e in elements]
    own = parsed[-1]
    if not own.get("By", [""])[0] or not own.get("Hash", [""])[0]:
        raise MalformedHeader("the last element lacks the sidecar's By= and Hash=")
    return own.get("URI", [""])[0] or None


def peer_address(peer: str) -> Address | None:
    """The IP address in grpc's peer string ("ipv4:10.0.0.7:5000", "ipv6:[::6]:5000"); None for
    anything else (a Unix socket)."""
    kind, _, rest = urllib.parse.unquote(peer).partition(":")
    if kind == "ipv4":
        host = rest.rpartition(":")[0]
    elif kind == "ipv6":
        host = rest.rpartition(":")[0].removeprefix("[").removesuffix("]").partition("%")[0]
    else:
        return None
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped  # a dual-stack socket's view of an IPv4 peer
    return address


@final
class SidecarPeers:
    """The addresses the sidecar connects from; a header from any other peer is not believed."""

    def __init__(self, networks: Iterable[Network]) -> None:
        self.networks = tuple(networks)

    def __contains__(self, peer: str) -> bool:
        address = peer_address(peer)
        return address is not None and any(address in n for n in self.networks)


__all__ = [
    "XFCC_HEADER",
    "MalformedHeader",
    "SidecarPeers",
    "forwarded_identity",
    "peer_address",
]
