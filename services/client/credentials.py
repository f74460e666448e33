"""How a client proves who it is: a bearer token (auth mode token), TLS with the server's CA,
and a client certificate (auth mode mtls). Paths to PEM files, as the CLI flags take them.

    Credentials(token=..., tls_ca=..., tls_cert=..., tls_key=...)
        .metadata(tenant)  ─▶ authorization: Bearer <token>, x-mmgate-tenant
        .channel(target)   ─▶ a TLS channel when any TLS file is given, else plaintext; with
                              grpc's retry of UNAVAILABLE before any answer (RETRY_POLICY)

The token goes as call metadata rather than grpc call credentials, which grpc sends only over
TLS: behind a mesh sidecar the app port is plaintext on the pod's loopback.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Final, final

import grpc

from ..wire import AUTHORIZATION_HEADER, TENANT_HEADER

# grpc retries a call that ended UNAVAILABLE before any response message reached the client (a
# replica killed, its connection refused, a server draining): behind a proxy or the mesh the
# retry lands on another replica. A stream that has begun answering is never retried (its
# tokens would come twice); every unary call and a stream not yet started are.
RETRY_POLICY: Final = {
    "maxAttempts": 3,
    "initialBackoff": "0.1s",
    "maxBackoff": "1s",
    "backoffMultiplier": 2,
    "retryableStatusCodes": ["UNAVAILABLE"],
}
_SERVICE_CONFIG: Final = json.dumps(
    {
        "methodConfig": [
            {
                "name": [{"service": "mmgate.v1.Inference"}, {"service": "mmgate.v1.Cache"}],
                "retryPolicy": RETRY_POLICY,
            }
        ]
    }
)
# a request is kept for a retry up to this size (grpc's default, 256 KiB, leaves an image out)
_RETRY_BUFFER_BYTES: Final = 64 * 1024 * 1024


# the largest answer taken (gRPC's default, 4 MiB, is less than a server sends at its defaults:
# an answer of several samples with log-probabilities can pass it)
MAX_ANSWER_BYTES: Final = 64 * 1024 * 1024


def channel_options(*, retries: bool) -> list[tuple[str, object]]:
    taken = ("grpc.max_receive_message_length", MAX_ANSWER_BYTES)
    if not retries:
        return [("grpc.enable_retries", 0), taken]
    return [
        taken,
        ("grpc.enable_retries", 1),
        ("grpc.service_config", _SERVICE_CONFIG),
        ("grpc.per_rpc_retry_buffer_size", _RETRY_BUFFER_BYTES),
        ("grpc.retry_buffer_size", 4 * _RETRY_BUFFER_BYTES),
    ]


def _read(path: str | Path | None) -> bytes | None:
    return None if path is None else Path(path).read_bytes()


@final
@dataclass(frozen=True, slots=True)
class Credentials:
    token: str | None = None
    tls_ca: str | Path | None = None  # the CA that signed the server's certificate
    tls_cert: str | Path | None = None  # the client certificate (mtls)
    tls_key: str | Path | None = None

    def __post_init__(self) -> None:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("a client certificate needs its key (tls_cert with tls_key)")

    @property
    def tls(self) -> bool:
        return self.tls_ca is not None or self.tls_cert is not None

    def metadata(self, tenant: str | None) -> tuple[tuple[str, str], ...]:
        pairs = []
        if self.token:
            pairs.append((AUTHORIZATION_HEADER, f"Bearer {self.token}"))
        if tenant:
            pairs.append((TENANT_HEADER, tenant))
        return tuple(pairs)

    def channel_credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=_read(self.tls_ca),
            private_key=_read(self.tls_key),
            certificate_chain=_read(self.tls_cert),
        )

    def aio_channel(self, target: str, *, retries: bool = True) -> grpc.aio.Channel:
        options = channel_options(retries=retries)
        if self.tls:
            return grpc.aio.secure_channel(target, self.channel_credentials(), options=options)
        return grpc.aio.insecure_channel(target, options=options)

    def channel(self, target: str, *, retries: bool = True) -> grpc.Channel:
        options = channel_options(retries=retries)
        if self.tls:
            return grpc.secure_channel(target, self.channel_credentials(), options=options)
        return grpc.insecure_channel(target, options=options)


__all__ = ["RETRY_POLICY", "Credentials", "channel_options"]
