"""Beyond max_concurrent_requests (16 in the test server) a call gets RESOURCE_EXHAUSTED at once."""

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest

from services.client import MmgateClient, build_request
from services.proto.mmgate.v1 import inference_pb2 as pb
from tests.services.statuses import error_details
from tests.support import RunningServer

LIMIT = 16  # MMGATE_MAX_CONCURRENT_REQUESTS of the session's server


# Stream windows of 1 KiB, never grown: a stream the client does not read stalls the server's
# writes after ~40 tokens, so the server holds its 16 requests however fast the engine is.
SMALL_WINDOWS = [("grpc.http2.lookahead_bytes", 1024), ("grpc.http2.bdp_probe", 0)]


@pytest.fixture
async def client(server: RunningServer) -> AsyncIterator[MmgateClient]:
    channel = grpc.aio.insecure_channel(server.target, options=SMALL_WINDOWS)
    async with MmgateClient(server.target, timeout=60.0, channel=channel) as client:
        yield client


async def test_overload_is_refused_and_the_server_recovers(client: MmgateClient) -> None:
    # as long as the context allows, unread: none can finish before the 17th call is refused
    request = build_request("Long", max_tokens=990, ignore_eos=True)
    streams = [client.generate(request) for _ in range(LIMIT)]
    # every one of them has produced a token: all are in progress
    await asyncio.gather(*(anext(stream) for stream in streams))

    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await client.complete("One too many", max_tokens=1)
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    reasons = [getattr(d, "reason", None) for d in error_details(caught.value)]
    assert "OVERLOADED" in reasons
    # a prefetch does a request's work (decode, encode): it is admitted as a request is
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await client.prefetch(b"\x89PNG\r\n\x1a\n")
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, caught.value.details()
    assert "OVERLOADED" in [getattr(d, "reason", None) for d in error_details(caught.value)]

    for stream in streams:
        await stream.aclose()  # cancels the call
    assert (await back_to_normal(client)).final.usage.completion_tokens == 2


async def back_to_normal(client: MmgateClient, attempts: int = 200) -> pb.CompleteResponse:
    """The server frees its slots as it processes the cancellations; ask until it has."""
    for _ in range(attempts):
        try:
            return await client.complete("Back to normal", max_tokens=2, ignore_eos=True)
        except grpc.aio.AioRpcError as error:
            if error.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                raise
    raise AssertionError("the server never freed its slots")
