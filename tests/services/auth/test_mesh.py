"""Auth mode mesh: behind an Istio sidecar with STRICT mTLS, the caller is the SPIFFE identity
the sidecar puts in x-forwarded-client-cert. mmgate trusts the header because only the sidecar
can reach the port (docs/security.md); here the test plays the sidecar."""

from __future__ import annotations

import grpc
import pytest
from grpc_health.v1 import health_pb2

from services.client import MmgateClient, error_reason
from services.proto.mmgate.v1 import cache_pb2
from tests.services.auth.conftest import xfcc
from tests.support import RunningServer

pytestmark = pytest.mark.asyncio(loop_scope="module")


async def stats_as(server: RunningServer, header: str | None) -> cache_pb2.GetStatsResponse:
    async with MmgateClient(server.target, timeout=30.0) as c:
        metadata = () if header is None else (("x-forwarded-client-cert", header),)
        response: cache_pb2.GetStatsResponse = await c.cache.GetStats(
            cache_pb2.GetStatsRequest(), metadata=metadata, timeout=30
        )
        return response


async def test_the_sidecars_principal_is_the_tenant(mesh_server: RunningServer) -> None:
    assert (
        await stats_as(mesh_server, xfcc("spiffe://cluster.local/ns/apps/sa/frontend"))
    ).tenant == "alpha"
    assert (
        await stats_as(mesh_server, xfcc("spiffe://cluster.local/ns/apps/sa/batch"))
    ).tenant == "beta"
    # a caller-supplied element before the sidecar's own is not the one believed
    forged = xfcc("spiffe://cluster.local/ns/apps/sa/frontend")
    chained = f"{forged},{xfcc('spiffe://cluster.local/ns/apps/sa/batch')}"
    assert (await stats_as(mesh_server, chained)).tenant == "beta"


@pytest.mark.parametrize(
    ("header", "reason"),
    [
        (None, "CREDENTIALS_MISSING"),
        ('By=spiffe://cluster.local/ns/ml/sa/mmgate;Hash=1;Subject=""', "CREDENTIALS_MISSING"),
        (xfcc("spiffe://cluster.local/ns/other/sa/intruder"), "CREDENTIALS_INVALID"),
    ],
)
async def test_no_or_unknown_identity_is_unauthenticated(
    mesh_server: RunningServer, header: str | None, reason: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stats_as(mesh_server, header)
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert error_reason(caught.value) == reason


async def test_probes_need_no_identity(mesh_server: RunningServer) -> None:
    # kubelet's gRPC probes reach the plaintext port without the sidecar's header
    async with MmgateClient(mesh_server.target, timeout=30.0) as c:
        assert await c.health("readiness") == health_pb2.HealthCheckResponse.SERVING
