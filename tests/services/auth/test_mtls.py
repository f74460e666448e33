"""Auth mode mtls: client certificates of one CA, the tenant from the certificate's names, and a
server certificate rotated without a restart. A caller without a certificate of that CA fails
the TLS handshake: it sees UNAVAILABLE, and nothing is served to it."""

from __future__ import annotations

import socket
import ssl
from pathlib import Path

import grpc
import pytest
from cryptography import x509

from services.client import MmgateClient, error_reason
from tests.services.auth.support import Pki, with_cert
from tests.support import RunningServer, eventually
from tests.tls_support import Issued

pytestmark = pytest.mark.asyncio(loop_scope="module")


def client(server: RunningServer, pki: Pki, cert: Issued | None) -> MmgateClient:
    return MmgateClient(server.target, credentials=with_cert(pki, cert), timeout=30.0)


async def test_each_kind_of_name_maps_to_its_tenant(
    mtls_server: RunningServer, pki: Pki, client_certs: dict[str, Issued]
) -> None:
    # URI SAN (a SPIFFE ID), DNS SAN, CN: each maps to its tenant
    for name, expected in (("alpha", "alpha"), ("beta", "beta"), ("ops", "ops")):
        async with client(mtls_server, pki, client_certs[name]) as c:
            stats = await c.stats(all_tenants=name == "ops")
            assert stats.tenant == expected
            assert stats.HasField("actor") == (name == "ops")  # ops is the admin
    async with client(mtls_server, pki, client_certs["alpha"]) as c:
        answer = await c.complete("Hi", max_tokens=2)
    assert answer.final.usage.completion_tokens == 2


async def test_callers_without_a_certificate_of_the_ca_are_served_nothing(
    mtls_server: RunningServer, pki: Pki, client_certs: dict[str, Issued]
) -> None:
    async with client(mtls_server, pki, client_certs["ops"]) as admin:
        before = (await admin.stats()).engine.requests
    for cert in (None, client_certs["foreign"]):
        async with client(mtls_server, pki, cert) as c:
            for call in (c.complete("Hi", max_tokens=2), c.stats()):
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await call
                # the handshake failed: no call reached mmgate
                assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    async with client(mtls_server, pki, client_certs["ops"]) as admin:
        after = await admin.stats()
    assert after.engine.requests == before
    # a certificate of the CA whose names map to no tenant: the handshake passes, mmgate refuses
    async with client(mtls_server, pki, client_certs["unmapped"]) as c:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await c.complete("Hi", max_tokens=2)
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert error_reason(caught.value) == "CREDENTIALS_INVALID"


def served_certificate_cn(target: str, pki: Pki, cert: Issued) -> str:
    """The CN of the certificate a new TLS connection to ``target`` is shown."""
    host, port = target.rsplit(":", 1)
    context = ssl.create_default_context(cafile=str(pki.ca.issued.cert))
    context.load_cert_chain(cert.cert, cert.key)
    context.set_alpn_protocols(["h2"])
    with (
        socket.create_connection((host, int(port)), timeout=10) as sock,
        context.wrap_socket(sock, server_hostname=host) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    names = x509.load_der_x509_certificate(der).subject.get_attributes_for_oid(
        x509.oid.NameOID.COMMON_NAME
    )
    return str(names[0].value)


async def test_a_rotated_server_certificate_is_served_without_a_restart(
    mtls_server: RunningServer, pki: Pki, client_certs: dict[str, Issued]
) -> None:
    files = (
        Path(mtls_server.env["MMGATE_AUTH__TLS_CERT_FILE"]),
        Path(mtls_server.env["MMGATE_AUTH__TLS_KEY_FILE"]),
    )
    alpha = client_certs["alpha"]
    assert served_certificate_cn(mtls_server.target, pki, alpha) == "mmgate"
    renewed = pki.ca.issue("server-renewed", "mmgate-renewed", server=True)
    # as cert-manager writes a renewal: key and certificate replaced
    for source, target in zip((renewed.cert, renewed.key), files, strict=True):
        staging = target.with_suffix(".new")
        staging.write_bytes(source.read_bytes())
        staging.replace(target)

    async def renewed_served() -> bool:
        return served_certificate_cn(mtls_server.target, pki, alpha) == "mmgate-renewed"

    await eventually(renewed_served, timeout=10)
    async with client(mtls_server, pki, alpha) as c:  # and calls go on over it
        assert (await c.stats()).tenant == "alpha"
    assert mtls_server.process.poll() is None
