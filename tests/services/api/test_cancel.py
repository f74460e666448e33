"""Leaving early, by cancellation or by deadline, aborts the engine request at once."""

import grpc
import pytest

from services.client import MmgateClient, build_request
from services.proto.mmgate.v1 import cache_pb2

TRIES = 20


async def settled_engine(client: MmgateClient, ticks: int = 5) -> cache_pb2.EngineCacheStats:
    """Engine stats once the engine has stepped with nothing left running: a short request
    forces a step, and vLLM's stats of a step can still count an abort it takes at the next."""
    for _ in range(ticks):
        await client.complete("tick", max_tokens=1)
        stats = (await client.stats()).engine
        if stats.running == 0:
            break
    return stats


@pytest.mark.parametrize("samples", [1, 4])
async def test_cancelled_stream_aborts_the_engine_request(
    client: MmgateClient, samples: int
) -> None:
    # four samples are four sequences in the engine: the cancellation ends all of them
    request = build_request(
        "Long story",
        max_tokens=900,
        ignore_eos=True,
        temperature=0.0 if samples == 1 else 1.0,
        n=samples if samples > 1 else None,
    )
    # On a loaded 2-core machine the engine core (its own process) can generate all 900 tokens
    # of the tiny model before the server's loop has sent the first one (vLLM then merges the
    # deltas): nothing is left to abort when the cancellation lands. Such a run must have
    # finished whole; the test tries again until a cancellation lands mid-generation (seen: 5 tries
    # in a row finished whole during a full suite run; each try costs about a second).
    for _ in range(TRIES):
        before = await settled_engine(client)
        stream = client.generate(request)
        first = await anext(stream)
        assert first.HasField("delta")
        await stream.aclose()  # cancels the call

        after = await settled_engine(client)
        assert after.running == 0
        if after.aborted == before.aborted + 1:
            return
        assert after.aborted == before.aborted
        # the long request (whole), and at least one tick
        assert after.requests >= before.requests + 2
    raise AssertionError(f"the engine finished 900 tokens before each of {TRIES} cancellations")


async def test_deadline_exceeded_aborts_the_engine_request(client: MmgateClient) -> None:
    before = await settled_engine(client)
    request = build_request("Long story", max_tokens=900, ignore_eos=True, temperature=0.0)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        # 900 tokens take the tiny model ~0.5 s on an idle 2-core machine: 0.2 s cannot hold them
        async for _ in client.generate(request, timeout=0.2):
            pass
    assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    after = await settled_engine(client)
    assert after.aborted == before.aborted + 1
    assert after.running == 0


async def test_a_unary_call_past_its_deadline_aborts_its_final_only_run(
    client: MmgateClient,
) -> None:
    """A unary call's run sends nothing before its end: leaving still aborts it at once."""
    before = await settled_engine(client)
    request = build_request(
        "Long story", max_tokens=900, ignore_eos=True, temperature=1.0, n=2, cache_policy="bypass"
    )
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await client.complete_request(request, timeout=0.2)
    assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    after = await settled_engine(client)
    assert after.aborted == before.aborted + 1
    assert after.running == 0
