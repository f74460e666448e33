"""Who is calling: one Authenticator per auth mode, chosen once from the settings.

    none   LabelAuth        x-mmgate-tenant is a label (any caller may name any tenant): admin
    token  TokenAuth        authorization: Bearer <token> ─▶ TokenTable ─▶ grant
    mtls   CertificateAuth  the verified client certificate's URI/DNS SAN or CN ─▶ identities
    mesh   MeshAuth         from the sidecar's address only: its x-forwarded-client-cert URI
                            ─▶ identities

Each answers ``grant(context)`` with the credential's Grant or raises Unauthenticated. What the
tenant header may then say is the gate's rule (gate.py), the same for every mode.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Mapping
from typing import Protocol, final

import grpc

from ...config import AuthSettings, Grant
from ...errors import Unauthenticated
from ...wire import (
    AUTHORIZATION_HEADER,
    CREDENTIALS_INVALID,
    CREDENTIALS_MISSING,
    UNTRUSTED_PEER,
)
from ..metadata import metadata_value, metadata_values
from .certs import peer_identities
from .mesh import XFCC_HEADER, MalformedHeader, SidecarPeers, forwarded_identity
from .tokens import TokenTable

log = logging.getLogger("mmgate.auth")


class Authenticator(Protocol):
    mode: str

    def grant(self, context: grpc.aio.ServicerContext) -> Grant | None:
        """The caller's grant; None in mode none (the header decides); raises Unauthenticated."""
        ...

    def tenants(self) -> frozenset[str]:
        """The tenants the credentials name (for a fair share of what is shared)."""
        ...

    def reload(self) -> None:
        """Read credentials anew where they come from files (SIGHUP)."""
        ...

    def refresh(self) -> None:
        """The poll: read credentials files that have changed (or gone missing)."""
        ...


class _Fixed:
    """Credentials that do not change while the server runs."""

    def reload(self) -> None:
        return None

    def refresh(self) -> None:
        return None


@final
class LabelAuth(_Fixed):
    mode = "none"

    def grant(self, context: grpc.aio.ServicerContext) -> Grant | None:
        return None

    def tenants(self) -> frozenset[str]:
        return frozenset()


@final
class TokenAuth:
    mode = "token"

    def __init__(self, table: TokenTable) -> None:
        self.table = table

    def grant(self, context: grpc.aio.ServicerContext) -> Grant:
        header = metadata_value(context, AUTHORIZATION_HEADER)
        if not header:
            raise Unauthenticated("a bearer token is required", CREDENTIALS_MISSING)
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthenticated("authorization must be 'Bearer <token>'", CREDENTIALS_INVALID)
        grant = self.table.grant(token.strip())
        if grant is None:
            raise Unauthenticated("the bearer token is not valid", CREDENTIALS_INVALID)
        return grant

    def tenants(self) -> frozenset[str]:
        return self.table.tenants()

    def reload(self) -> None:
        self.table.reload()

    def refresh(self) -> None:
        self.table.refresh()


class _Identities(_Fixed):
    def __init__(self, identities: Mapping[str, Grant]) -> None:
        self.identities = dict(identities)
        self._tenants = frozenset(g.tenant for g in self.identities.values() if g.role == "tenant")

    def tenants(self) -> frozenset[str]:
        return self._tenants


@final
class CertificateAuth(_Identities):
    mode = "mtls"

    def grant(self, context: grpc.aio.ServicerContext) -> Grant:
        # the handshake has verified the certificate against the client CA: only its names remain
        names = peer_identities(context)
        if not names:
            raise Unauthenticated("a client certificate is required", CREDENTIALS_MISSING)
        for name in names:
            if (grant := self.identities.get(name)) is not None:
                return grant
        raise Unauthenticated(
            "the client certificate names no tenant this server knows", CREDENTIALS_INVALID
        )


@final
class MeshAuth(_Identities):
    mode = "mesh"

    def __init__(
        self, identities: Mapping[str, Grant], sidecar: SidecarPeers, *, sanitized: bool
    ) -> None:
        super().__init__(identities)
        self.sidecar = sidecar
        self.sanitized = sanitized

    def grant(self, context: grpc.aio.ServicerContext) -> Grant:
        # a header is only as true as the connection it came on: the sidecar's, or no one's
        if context.peer() not in self.sidecar:
            raise Unauthenticated(
                "this connection does not come from the mesh sidecar", UNTRUSTED_PEER
            )
        try:
            identity = forwarded_identity(
                metadata_values(context, XFCC_HEADER), sanitized=self.sanitized
            )
        except MalformedHeader as exc:
            raise Unauthenticated(
                f"x-forwarded-client-cert is not the sidecar's: {exc}", CREDENTIALS_INVALID
            ) from None
        if identity is None:
            raise Unauthenticated(
                "no caller identity from the mesh (x-forwarded-client-cert)", CREDENTIALS_MISSING
            )
        grant = self.identities.get(identity)
        if grant is None:
            raise Unauthenticated(
                "the mesh identity names no tenant this server knows", CREDENTIALS_INVALID
            )
        return grant


def announce_trust(settings: AuthSettings, host: str) -> None:
    """At start, in mesh mode: whom the header is believed from, and a listener on loopback,
    which the sidecar cannot reach (Istio 1.10 and later forward to the pod's address)."""
    if settings.mode != "mesh":
        return
    log.info(
        "mesh mode: x-forwarded-client-cert believed only from the sidecar at %s (%s)",
        ", ".join(str(n) for n in settings.sidecar_peers) or "no address",
        settings.sidecar_xfcc,
    )
    if _loopback(host):
        log.warning(
            "mesh mode on %s: the sidecar forwards to the pod's address, so it cannot reach a "
            "server listening on loopback only",
            host,
        )


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def authenticator(settings: AuthSettings) -> Authenticator:
    """The variant the mode names; a bad tokens file refuses to start (ValueError)."""
    if settings.mode == "token":
        table = TokenTable(
            settings.tokens_file,
            settings.tokens,
            missing_grace=settings.tokens_missing_grace_seconds,
        )
        return TokenAuth(table)
    if settings.mode == "mtls":
        return CertificateAuth(settings.identities)
    if settings.mode == "mesh":
        return MeshAuth(
            settings.identities,
            SidecarPeers(settings.sidecar_peers),
            sanitized=settings.sidecar_xfcc == "sanitize_set",
        )
    return LabelAuth()


__all__ = [
    "Authenticator",
    "CertificateAuth",
    "LabelAuth",
    "MeshAuth",
    "TokenAuth",
    "announce_trust",
    "authenticator",
]
