"""Inference.Abort between tenants, on the whole server over the synthetic engine: a tenant
reaches its own requests only, and another's id is as unknown as one nobody sent."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import pytest

from services.client import build_request
from services.client.requests import error_reason
from services.engine.synthetic_engine import SyntheticEngine
from tests.services.api.synthetic_server import client_of, synthetic_server
from tests.services.auth.support import TOKENS
from tests.support import eventually

pytestmark = pytest.mark.asyncio(loop_scope="function")


async def test_a_tenant_aborts_its_own_request_and_cannot_reach_anothers(
    tiny_model: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    async with synthetic_server(
        tiny_model, tmp_path_factory.mktemp("aborts"), step_seconds=0.005
    ) as (server, _):
        engine = server.engine
        assert isinstance(engine, SyntheticEngine)

        def running(count: int) -> Callable[[], Awaitable[bool]]:
            async def holds() -> bool:
                return engine.stats().running == count

            return holds

        long: dict[str, Any] = {"max_tokens": 2000, "ignore_eos": True, "temperature": 0.0}
        async with (
            client_of(server, TOKENS["alpha"]) as alpha,
            client_of(server, TOKENS["beta"]) as beta,
        ):
            # the same id in both tenants, each request running
            streams = {
                name: client.generate(build_request("Long story", request_id="job-1", **long))
                for name, client in (("alpha", alpha), ("beta", beta))
            }
            for stream in streams.values():
                first = await anext(stream)
                assert first.HasField("delta")
            assert engine.stats().running == 2

            refusals = []
            for request_ids in (["job-1-of-nobody"], ["job-2"]):
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await beta.abort(*request_ids)
                refusals.append((caught.value.code(), caught.value.details()))
            # alpha's only other id is as unknown to beta as an id nobody sent
            with pytest.raises(grpc.aio.AioRpcError) as unknown:
                await alpha.abort("job-2")
            assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
            assert error_reason(unknown.value) == "REQUEST_NOT_FOUND"
            assert refusals[0] == refusals[1] == (unknown.value.code(), unknown.value.details())

            # alpha aborts its job-1: beta's job-1 runs on
            assert await alpha.abort("job-1") == ["job-1"]
            with pytest.raises(grpc.aio.AioRpcError) as ended:
                async for _ in streams["alpha"]:
                    pass
            assert ended.value.code() == grpc.StatusCode.CANCELLED
            assert error_reason(ended.value) == "REQUEST_ABORTED"
            await eventually(running(1), timeout=10)
            more = await anext(streams["beta"])
            assert more.HasField("delta")
            assert await beta.abort("job-1") == ["job-1"]
            with pytest.raises(grpc.aio.AioRpcError):
                async for _ in streams["beta"]:
                    pass
            await eventually(running(0), timeout=10)
            assert len(server.inference.calls) == 0
