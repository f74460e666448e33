"""Each tenant's share: of concurrent requests (RESOURCE_EXHAUSTED with a retry hint beyond it,
while other tenants are served) and of the cache's bytes. token_server names two tenants, so by
default each gets half of the server's 8 requests (less the 2 kept for admins) and 64 MiB; an
admin is served while both tenants hold their full shares."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2

from services.client import Credentials, MmgateClient, error_reason
from tests.services.auth.support import TOKEN_GRANTS, Pki, as_tenant, served_as, write_tokens
from tests.services.imagegen import large_png, png, variant
from tests.support import RunningServer, engine_core, eventually

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
        # half of MMGATE_MAX_CONCURRENT_REQUESTS=8 less the admins' reserve of 2: two tenants
        assert share == 3
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


async def test_an_admin_is_served_while_the_tenants_hold_their_full_shares(
    token_server: RunningServer, pki: Pki
) -> None:
    """alpha and beta hold every call their shares allow (the engine core stopped, so nothing
    ends): the admin's call is admitted from the reserve, where it once got OVERLOADED at once."""
    core = engine_core(token_server)
    assert core is not None, token_server.log()
    creds = {name: as_tenant(pki, name) for name in ("alpha", "beta", "ops")}
    clients = {
        n: MmgateClient(token_server.target, credentials=c, timeout=120) for n, c in creds.items()
    }
    async with clients["alpha"] as alpha, clients["beta"] as beta, clients["ops"] as ops:
        share = (await alpha.stats()).tenants[0].max_concurrent_requests
        core.suspend()
        try:
            held = [
                asyncio.ensure_future(c.complete(f"Hold {i}", max_tokens=1, cache_policy="bypass"))
                for c in (alpha, beta)
                for i in range(share)
            ]

            async def all_held() -> bool:
                every = {
                    t.tenant: t.active_requests for t in (await ops.stats(all_tenants=True)).tenants
                }
                return every.get("alpha") == every.get("beta") == share

            await eventually(all_held, timeout=30)
            prefetched = await ops.prefetch(png(4343))  # admitted: no engine needed
        finally:
            core.resume()
        finished = await asyncio.gather(*held)
    assert prefetched.digest
    assert all(f.final.usage.completion_tokens == 1 for f in finished)


async def test_every_tenant_with_calls_in_progress_is_listed(
    token_server: RunningServer, pki: Pki, tokens_file: Path
) -> None:
    """A tenant whose only call waits on the engine, having touched no cache yet, is in an
    admin's GetStats(all_tenants) with its call counted."""
    core = engine_core(token_server)
    assert core is not None, token_server.log()
    delta = Credentials(token="delta-token-77c1", tls_ca=pki.ca.issued.cert)
    try:
        write_tokens(tokens_file, {**TOKEN_GRANTS, "delta-token-77c1": "delta"})
        async with (
            MmgateClient(token_server.target, credentials=delta, timeout=120) as newcomer,
            MmgateClient(
                token_server.target, credentials=as_tenant(pki, "ops"), timeout=120
            ) as ops,
        ):
            await eventually(lambda: served_as(token_server.target, delta, "delta"), timeout=10)
            core.suspend()
            try:
                call = asyncio.ensure_future(
                    newcomer.complete("Wait", max_tokens=1, cache_policy="bypass")
                )

                async def listed() -> bool:
                    every = {t.tenant: t for t in (await ops.stats(all_tenants=True)).tenants}
                    return "delta" in every and every["delta"].active_requests == 1

                await eventually(listed, timeout=30)
            finally:
                core.resume()
            assert (await call).final.usage.completion_tokens == 1
    finally:
        write_tokens(tokens_file, TOKEN_GRANTS)
