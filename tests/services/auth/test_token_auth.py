"""Auth mode token over TLS: who may call, as which tenant, and tokens that change under a
running server (a file rewritten, SIGHUP)."""

from __future__ import annotations

import os
import signal
from collections.abc import Awaitable
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from services.client import Credentials, MmgateClient, error_reason
from services.proto.mmgate.v1 import cache_pb2
from services.wire import TENANT_HEADER
from tests.services.auth.support import (
    TOKEN_GRANTS,
    TOKENS,
    Pki,
    as_tenant,
    refused,
    served_as,
    write_tokens,
)
from tests.support import RunningServer, eventually

pytestmark = pytest.mark.asyncio(loop_scope="module")


def client(server: RunningServer, credentials: Credentials, **kwargs: object) -> MmgateClient:
    return MmgateClient(server.target, credentials=credentials, timeout=60.0, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("token", "reason"),
    [(None, "CREDENTIALS_MISSING"), ("not-a-token", "CREDENTIALS_INVALID")],
)
async def test_no_or_wrong_token_is_unauthenticated_for_every_call(
    token_server: RunningServer, pki: Pki, token: str | None, reason: str
) -> None:
    async with client(token_server, Credentials(token=token, tls_ca=pki.ca.issued.cert)) as c:
        for call in (
            c.complete("Hi", max_tokens=1),
            c.stats(),
            c.inspect(digest="sha256:" + "0" * 64),
        ):
            error = await refused(call)
            assert error.code() == grpc.StatusCode.UNAUTHENTICATED
            assert error_reason(error) == reason
            # mmgate's words, nothing of the server's insides
            assert "Error" not in error.details()
            assert "Traceback" not in error.details()
        # and the server keeps serving those who have a token
    async with client(token_server, as_tenant(pki, "alpha")) as c:
        assert (await c.complete("Hi", max_tokens=1)).final.usage.completion_tokens == 1


async def test_a_malformed_authorization_header_is_unauthenticated(
    token_server: RunningServer, pki: Pki
) -> None:
    async with client(token_server, Credentials(tls_ca=pki.ca.issued.cert)) as c:
        error = await refused(
            c.cache.GetStats(
                cache_pb2.GetStatsRequest(),
                metadata=(("authorization", f"Basic {TOKENS['alpha']}"),),
                timeout=30,
            )
        )
    assert error.code() == grpc.StatusCode.UNAUTHENTICATED
    assert error_reason(error) == "CREDENTIALS_INVALID"


async def test_a_tenant_header_naming_another_tenant_is_refused(
    token_server: RunningServer, pki: Pki
) -> None:
    async with client(token_server, as_tenant(pki, "alpha"), tenant="beta") as c:
        error = await refused(c.complete("Hi", max_tokens=1))
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED
    assert error_reason(error) == "TENANT_MISMATCH"
    # its own tenant named is fine
    async with client(token_server, as_tenant(pki, "alpha"), tenant="alpha") as c:
        assert (await c.stats()).tenant == "alpha"
    # an admin names other tenants' entries in the request, not by claiming to be them
    async with client(token_server, as_tenant(pki, "ops"), tenant="alpha") as c:
        assert (await refused(c.stats())).code() == grpc.StatusCode.PERMISSION_DENIED
    assert TENANT_HEADER == "x-mmgate-tenant"


async def test_health_and_reflection_stay_open(token_server: RunningServer, pki: Pki) -> None:
    async with client(token_server, Credentials(tls_ca=pki.ca.issued.cert)) as c:
        assert await c.health() == health_pb2.HealthCheckResponse.SERVING
        stub = reflection_pb2_grpc.ServerReflectionStub(c.channel)
        responses = stub.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=30
        )
        async for response in responses:
            names = {s.name for s in response.list_services_response.service}
            assert "mmgate.v1.Inference" in names
            break


async def test_plaintext_reaches_nothing_on_a_tls_port(token_server: RunningServer) -> None:
    async with MmgateClient(
        token_server.target, credentials=Credentials(token=TOKENS["alpha"]), timeout=5
    ) as c:
        error = await refused(c.complete("Hi", max_tokens=1))
    assert error.code() == grpc.StatusCode.UNAVAILABLE


async def test_tokens_reload_when_the_file_changes_and_on_sighup(
    token_server: RunningServer, pki: Pki, tokens_file: Path
) -> None:
    gamma = Credentials(token="gamma-token-5e0a", tls_ca=pki.ca.issued.cert)

    def gamma_served() -> Awaitable[bool]:
        return served_as(token_server.target, gamma, "gamma")

    assert not await gamma_served()
    try:
        # a Secret update: new file contents, no signal
        write_tokens(tokens_file, {**TOKEN_GRANTS, "gamma-token-5e0a": "gamma"})
        await eventually(gamma_served, timeout=10)

        # a broken file keeps the tokens loaded before
        tokens_file.write_bytes(b"{not json")  # noqa: ASYNC240 - a test's one small write
        os.kill(token_server.process.pid, signal.SIGHUP)
        await eventually(lambda: _logged(token_server, "keeping the"), timeout=10)
        assert await gamma_served()

        # SIGHUP reads the file at once (here with gamma revoked)
        write_tokens(tokens_file, TOKEN_GRANTS)
        os.kill(token_server.process.pid, signal.SIGHUP)
        await eventually(lambda: _not(gamma_served), timeout=10)
    finally:
        write_tokens(tokens_file, TOKEN_GRANTS)
    async with client(token_server, as_tenant(pki, "beta")) as c:
        assert (await c.stats()).tenant == "beta"


async def test_a_tokens_file_missing_past_the_grace_refuses_every_token(
    token_server: RunningServer, pki: Pki, tokens_file: Path
) -> None:
    alpha = as_tenant(pki, "alpha")

    async def alpha_refused() -> bool:
        async with client(token_server, alpha) as c:
            try:
                await c.stats()
            except grpc.aio.AioRpcError as error:
                if error.code() != grpc.StatusCode.UNAUTHENTICATED:
                    raise
                return True
            return False

    assert not await alpha_refused()
    try:
        tokens_file.unlink()  # noqa: ASYNC240 - a test's one small file operation
        # the fixture's grace is 1 s, its poll 0.2 s
        await eventually(alpha_refused, timeout=15)
        assert await _logged(token_server, "every token it held is refused")
    finally:
        write_tokens(tokens_file, TOKEN_GRANTS)
    await eventually(lambda: _not(alpha_refused), timeout=15)


async def _logged(server: RunningServer, text: str) -> bool:
    return text in server.log_path.read_text(errors="replace")


async def _not(predicate: object) -> bool:
    return not await predicate()  # type: ignore[operator]
