"""Auth mode mesh: behind an Istio sidecar with STRICT mTLS, the caller is the SPIFFE identity
the sidecar puts in x-forwarded-client-cert, believed only on connections from the sidecar's
address (docs/security.md). Here HAProxy plays the sidecar's connection (from 127.0.0.6) and the
test writes the header the sidecar would; a direct connection is any other local process."""

from __future__ import annotations

import grpc
import pytest
from grpc_health.v1 import health_pb2

from services.client import MmgateClient, build_request, error_reason
from services.proto.mmgate.v1 import cache_pb2
from tests.services.auth.support import Mesh, xfcc
from tests.services.prom import scrape
from tests.support import RunningServer

pytestmark = pytest.mark.asyncio(loop_scope="module")

ADMIN = "spiffe://cluster.local/ns/ops/sa/admin"
FRONTEND = "spiffe://cluster.local/ns/apps/sa/frontend"
SIDECAR = "By=spiffe://cluster.local/ns/ml/sa/mmgate;Hash=abc"


async def stats_as(
    target: str, *headers: str, all_tenants: bool = False
) -> cache_pb2.GetStatsResponse:
    async with MmgateClient(target, timeout=30.0) as c:
        metadata = tuple(("x-forwarded-client-cert", h) for h in headers)
        response: cache_pb2.GetStatsResponse = await c.cache.GetStats(
            cache_pb2.GetStatsRequest(all_tenants=all_tenants), metadata=metadata, timeout=30
        )
        return response


async def refusal(target: str, *headers: str) -> tuple[grpc.StatusCode, str | None]:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stats_as(target, *headers, all_tenants=True)
    return caught.value.code(), error_reason(caught.value)


async def test_the_sidecars_principal_is_the_tenant(mesh_server: RunningServer) -> None:
    assert (await stats_as(mesh_server.target, xfcc(FRONTEND))).tenant == "alpha"
    batch = xfcc("spiffe://cluster.local/ns/apps/sa/batch")
    assert (await stats_as(mesh_server.target, batch)).tenant == "beta"
    # APPEND_FORWARD: a caller-supplied element before the sidecar's own is not the one believed
    assert (await stats_as(mesh_server.target, f"{xfcc(FRONTEND)},{batch}")).tenant == "beta"
    admin = await stats_as(mesh_server.target, xfcc(ADMIN), all_tenants=True)
    assert admin.tenant == "ops"


async def test_a_direct_connection_is_refused_whatever_header_it_sends(mesh: Mesh) -> None:
    before = (await scrape(mesh.server.metrics_url)).total(
        "mmgate_auth_refused_total", reason="UNTRUSTED_PEER"
    )
    # the well-formed admin header the sidecar would write, from a process that is not the sidecar
    for header in (
        f'{SIDECAR};Subject="";URI={ADMIN}',
        f"URI={ADMIN}",
        f"{SIDECAR};uri={ADMIN}",
    ):
        assert await refusal(mesh.direct, header) == (
            grpc.StatusCode.UNAUTHENTICATED,
            "UNTRUSTED_PEER",
        )
    async with MmgateClient(mesh.direct, timeout=30.0) as c:
        metadata = (("x-forwarded-client-cert", xfcc(FRONTEND)),)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await c.inference.Complete(build_request("Hi", max_tokens=1), metadata=metadata)
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
        # probes reach the server from the kubelet or Istio's agent, not through the sidecar
        assert await c.health("readiness") == health_pb2.HealthCheckResponse.SERVING
    after = (await scrape(mesh.server.metrics_url)).total(
        "mmgate_auth_refused_total", reason="UNTRUSTED_PEER"
    )
    assert after - before == 4
    assert "believed only from the sidecar at 127.0.0.6/32, ::6/128" in mesh.server.log(400)


@pytest.mark.parametrize(
    "headers",
    [
        (f"URI={ADMIN}",),
        (f"uri={ADMIN}",),
        (f"{SIDECAR};uri={ADMIN}",),
        (f"by=spiffe://cluster.local/ns/ml/sa/mmgate;hash=abc;URI={ADMIN}",),
        # a forged header first, then the sidecar's own
        (xfcc(ADMIN), xfcc(FRONTEND)),
        # the last element without the sidecar's By= and Hash=
        (f"{xfcc(FRONTEND)},URI={ADMIN}",),
        (f"{xfcc(FRONTEND)},Hash=abc;URI={ADMIN}",),
    ],
    ids=[
        "bare-uri",
        "lowercase",
        "lowercase-uri",
        "lowercase-keys",
        "two-headers",
        "no-by",
        "no-by-2",
    ],
)
async def test_a_header_the_sidecar_did_not_write_is_refused(
    mesh_server: RunningServer, headers: tuple[str, ...]
) -> None:
    assert await refusal(mesh_server.target, *headers) == (
        grpc.StatusCode.UNAUTHENTICATED,
        "CREDENTIALS_INVALID",
    )


@pytest.mark.parametrize(
    ("header", "reason"),
    [
        (None, "CREDENTIALS_MISSING"),
        (f'{SIDECAR};Subject=""', "CREDENTIALS_MISSING"),
        (xfcc("spiffe://cluster.local/ns/other/sa/intruder"), "CREDENTIALS_INVALID"),
    ],
)
async def test_no_or_unknown_identity_is_unauthenticated(
    mesh_server: RunningServer, header: str | None, reason: str
) -> None:
    headers = () if header is None else (header,)
    assert await refusal(mesh_server.target, *headers) == (
        grpc.StatusCode.UNAUTHENTICATED,
        reason,
    )


async def test_probes_need_no_identity(mesh_server: RunningServer) -> None:
    async with MmgateClient(mesh_server.target, timeout=30.0) as c:
        assert await c.health("readiness") == health_pb2.HealthCheckResponse.SERVING
