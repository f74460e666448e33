"""The credentials of the auth tests' callers and what they send: tokens, certificates, the
mesh sidecar's header. The servers that take them are conftest.py's fixtures."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from services.api.auth import token_digest
from services.client import Credentials, MmgateClient
from tests.support import RunningServer
from tests.tls_support import CertificateAuthority, Issued

TOKENS = {"alpha": "alpha-token-0f3c9a", "beta": "beta-token-77d2e1", "ops": "ops-token-c41b08"}
MiB = 1024 * 1024


@dataclass(frozen=True)
class Pki:
    ca: CertificateAuthority
    server: Issued
    directory: Path


async def refused(call: object) -> grpc.aio.AioRpcError:
    """The error a call ends with; fails the test if it succeeds."""
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call  # type: ignore[misc]
    return caught.value


def write_tokens(path: Path, grants: dict[str, object]) -> None:
    """A tokens file as an operator writes it: digests of tokens, never the tokens. Written
    beside and renamed into place, as a Kubernetes Secret update swaps its files."""
    body = {token_digest(token): grant for token, grant in grants.items()}
    staging = path.with_suffix(".new")
    staging.write_text(json.dumps(body))
    staging.replace(path)


TOKEN_GRANTS: dict[str, object] = {
    TOKENS["alpha"]: "alpha",
    TOKENS["beta"]: "beta",
    TOKENS["ops"]: {"tenant": "ops", "role": "admin"},
}


def as_tenant(pki: Pki, name: str) -> Credentials:
    """token_server's caller ``name`` ("alpha", "beta", "ops")."""
    return Credentials(token=TOKENS[name], tls_ca=pki.ca.issued.cert)


async def served_as(target: str, credentials: Credentials, tenant: str) -> bool:
    """Whether ``credentials`` are known to the server at ``target`` as ``tenant``'s (a tokens
    file reloads within a moment: a test waits for it with ``eventually``)."""
    async with MmgateClient(target, credentials=credentials, timeout=60.0) as client:
        try:
            return (await client.stats()).tenant == tenant
        except grpc.aio.AioRpcError as error:
            if error.code() != grpc.StatusCode.UNAUTHENTICATED:
                raise
            return False


def with_cert(pki: Pki, cert: Issued | None) -> Credentials:
    if cert is None:
        return Credentials(tls_ca=pki.ca.issued.cert)
    return Credentials(tls_ca=pki.ca.issued.cert, tls_cert=cert.cert, tls_key=cert.key)


MESH_IDENTITIES = {
    "spiffe://cluster.local/ns/apps/sa/frontend": "alpha",
    "spiffe://cluster.local/ns/apps/sa/batch": "beta",
    "spiffe://cluster.local/ns/ops/sa/admin": {"tenant": "ops", "role": "admin"},
}


def xfcc(uri: str) -> str:
    """x-forwarded-client-cert as an Istio sidecar writes it for a caller's mTLS connection."""
    return f'By=spiffe://cluster.local/ns/ml/sa/mmgate;Hash=4f2c0e;Subject="";URI={uri}'


@dataclass(frozen=True)
class Mesh:
    """mesh_server and its sidecar: ``server.target`` is the sidecar's port (connections reach
    mmgate from 127.0.0.6, as Istio's REDIRECT mode sends them), ``direct`` mmgate's own."""

    server: RunningServer
    direct: str
