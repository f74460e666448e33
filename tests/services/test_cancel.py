"""Leaving early, by cancellation or by deadline, aborts the engine request at once."""

import grpc
import pytest

from services.client import MmgateClient, build_request
from services.proto.mmgate.v1 import cache_pb2


async def settled_engine(client: MmgateClient) -> cache_pb2.EngineCacheStats:
    """Engine stats once the engine has stepped again: a short request forces a step."""
    await client.complete("tick", max_tokens=1)
    return (await client.stats()).engine


async def test_cancelled_stream_aborts_the_engine_request(client: MmgateClient) -> None:
    before = await settled_engine(client)
    request = build_request("Long story", max_tokens=900, ignore_eos=True, temperature=0.0)
    stream = client.generate(request)
    first = await anext(stream)  # the engine is generating now
    assert first.HasField("delta")
    await stream.aclose()  # cancels the call

    after = await settled_engine(client)
    assert after.aborted == before.aborted + 1
    assert after.running == 0


async def test_deadline_exceeded_aborts_the_engine_request(client: MmgateClient) -> None:
    before = await settled_engine(client)
    request = build_request("Long story", max_tokens=900, ignore_eos=True, temperature=0.0)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        async for _ in client.generate(request, timeout=0.5):
            pass
    assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    after = await settled_engine(client)
    assert after.aborted == before.aborted + 1
    assert after.running == 0
