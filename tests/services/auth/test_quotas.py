"""Each tenant's share: of concurrent requests (RESOURCE_EXHAUSTED with a retry hint beyond it,
while other tenants are served) and of the cache's bytes. token_server names two tenants, so by
default each gets half of the server's 8 requests and 64 MiB."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2

from services.client import MmgateClient, error_reason
from tests.services.auth.support import Pki, as_tenant
from tests.services.imagegen import large_png, png, variant
from tests.support import RunningServer, eventually

pytestmark = pytest.mark.asyncio(loop_scope="module")
MiB = 1024 * 1024


def retry_delay(error: grpc.aio.AioRpcError) -> float | None:
    for key, value in error.trailing_metadata() or ():
        if key == "grpc-status-details-bin":
            assert isinstance(value, bytes)
            for detail in status_pb2.Status.FromString(value).details:
                info = error_details_pb2.RetryInfo()
                if detail.Unpack(info):
                    seconds: float = info.retry_delay.ToTimedelta().total_seconds()
                    return seconds
    return None


async def test_a_tenant_beyond_its_share_is_refused_while_others_are_served(
    token_server: RunningServer, pki: Pki
) -> None:
    async with (
        MmgateClient(
            token_server.target, credentials=as_tenant(pki, "alpha"), timeout=120
        ) as alpha,
        MmgateClient(token_server.target, credentials=as_tenant(pki, "beta"), timeout=120) as beta,
    ):
        share = (await alpha.stats()).tenants[0].max_concurrent_requests
        assert share == 4  # half of MMGATE_MAX_CONCURRENT_REQUESTS=8: two tenants configured
        big = large_png()  # each ~0.5 s to decode: the requests stay in progress a while
        held = [
            asyncio.ensure_future(
                alpha.complete("<image> what?", images=[variant(big, 900 + i)], max_tokens=1)
            )
            for i in range(share)
        ]

        async def all_in_progress() -> bool:
            return (await alpha.stats()).tenants[0].active_requests == share

        await eventually(all_in_progress, timeout=30)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await alpha.complete("Hi", max_tokens=1)
        # beta's share is its own
        served = await beta.complete("Hi", max_tokens=1)
        finished = await asyncio.gather(*held)
    error = caught.value
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert error_reason(error) == "TENANT_OVERLOADED"
    assert retry_delay(error) == 1.0
    assert served.final.usage.completion_tokens == 1
    assert all(f.final.usage.completion_tokens == 1 for f in finished)


async def test_each_tenant_holds_at_most_its_share_of_the_cache(
    token_server: RunningServer, pki: Pki
) -> None:
    async with MmgateClient(
        token_server.target, credentials=as_tenant(pki, "ops"), timeout=60
    ) as ops:
        every = {t.tenant: t for t in (await ops.stats(all_tenants=True)).tenants}
    async with MmgateClient(
        token_server.target, credentials=as_tenant(pki, "beta"), timeout=60
    ) as beta:
        digest = (await beta.prefetch(png(4242))).digest
        mine = (await beta.stats()).tenants[0]
        assert (await beta.inspect(digest=digest)).state == "stored"
    assert mine.budget_bytes == 1 * MiB
    assert all(t.budget_bytes == 1 * MiB and t.bytes <= 1 * MiB for t in every.values())
