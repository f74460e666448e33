"""The text path through the cache actor: prompts, shared responses, and the Cache service."""

import asyncio
from typing import Any

import grpc
import pytest

from services.client import MmgateClient, build_request
from services.proto.mmgate.v1 import inference_pb2 as pb
from tests.support import RunningServer


def lookup(final: pb.GenerateFinal, stage: str) -> pb.CacheLookup:
    (found,) = [entry for entry in final.cache.lookups if entry.stage == stage]
    return found


async def test_same_prompt_is_tokenized_once(client: MmgateClient) -> None:
    first = await client.complete("A prompt seen twice", max_tokens=2)
    second = await client.complete("A prompt seen twice", max_tokens=2)
    assert lookup(first.final, "prompt").outcome == "miss"
    hit = lookup(second.final, "prompt")
    assert (hit.outcome, hit.tier) == ("hit", "memory")
    assert hit.key == lookup(first.final, "prompt").key
    info = await client.inspect(hit.key)
    assert (info.state, info.hits) == ("stored", 1)
    assert info.bytes > 0


async def test_bypass_skips_the_cache(client: MmgateClient) -> None:
    response = await client.complete("Never cached", max_tokens=2, cache_policy="bypass")
    entry = lookup(response.final, "prompt")
    assert entry.outcome == "bypass"
    assert (await client.inspect(entry.key)).state == "absent"


async def test_identical_deterministic_requests_share_one_engine_run(
    client: MmgateClient,
) -> None:
    options: dict[str, Any] = {
        "max_tokens": 40,
        "temperature": 0.0,
        "ignore_eos": True,
        "cache_policy": "response",
    }
    before = (await client.stats()).engine.requests
    together = await asyncio.gather(
        *(client.complete("Shared answer please", **options) for _ in range(4))
    )
    assert len({r.text for r in together}) == 1
    outcomes = [lookup(r.final, "response").outcome for r in together]
    # one generated it; the others joined the run or, if it had already ended, replayed it
    assert outcomes.count("miss") == 1
    assert set(outcomes) <= {"miss", "coalesced", "hit"}
    assert [r.final.cache.response_from_cache for r in together].count(False) == 1

    later = await client.complete("Shared answer please", **options)
    assert later.text == together[0].text
    assert lookup(later.final, "response").outcome == "hit"
    assert later.final.cache.response_from_cache
    assert later.final.usage.completion_tokens == 40
    # one engine run for five requests (a request counts once it has finished in the engine)
    stats = await client.stats()
    assert stats.engine.requests - before == 1


async def test_a_request_during_or_after_a_run_is_served_by_it(client: MmgateClient) -> None:
    request = build_request(
        "Stream me slowly",
        max_tokens=990,
        temperature=0.0,
        ignore_eos=True,
        cache_policy="response",
    )
    first = aiter(client.generate(request))
    first_events = [await anext(first)]  # the run is in progress now
    second_events = [event async for event in client.generate(request)]
    first_events += [event async for event in first]

    def text(events: list[pb.GenerateResponse]) -> str:
        return "".join(e.delta.text for e in events if e.HasField("delta"))

    assert text(second_events) == text(first_events)
    joined = second_events[-1].final
    # joined live, or replayed if the real engine finished first (it may, on any machine):
    # either way not generated again; test_shared_response.py proves the live join, paced
    assert lookup(joined, "response").outcome in {"coalesced", "hit"}
    assert joined.cache.response_from_cache
    assert not first_events[-1].final.cache.response_from_cache


async def test_random_sampling_is_never_shared(client: MmgateClient) -> None:
    response = await client.complete(
        "Random please", max_tokens=4, temperature=1.0, cache_policy="response"
    )
    assert [e.stage for e in response.final.cache.lookups] == ["prompt"]
    assert not response.final.cache.response_from_cache


async def test_invalidate_forgets_a_key(client: MmgateClient) -> None:
    response = await client.complete("Forget me", max_tokens=2)
    key = lookup(response.final, "prompt").key
    assert await client.invalidate(key)
    assert (await client.inspect(key)).state == "absent"
    assert not await client.invalidate(key)


async def test_cache_keys_are_per_tenant(server: RunningServer) -> None:
    async with server.client(tenant="team-a") as a, server.client(tenant="team-b") as b:
        first = await a.complete("Tenant prompt", max_tokens=2)
        other = await b.complete("Tenant prompt", max_tokens=2)
        assert lookup(first.final, "prompt").outcome == "miss"
        assert lookup(other.final, "prompt").outcome == "miss"
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            async with server.client(tenant="bad tenant!") as bad:
                await bad.complete("x", max_tokens=1)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_get_stats_shows_both_caches(client: MmgateClient) -> None:
    long_prefix = "You are a helpful assistant. " * 40  # several KV blocks of 128 tokens
    for _ in range(2):
        await client.complete(messages=[("system", long_prefix)], prompt="Hi", max_tokens=2)
    stats = await client.stats()
    assert stats.model == "tiny"
    assert stats.actor.alive
    assert stats.actor.hits >= 1
    assert stats.engine.prefix_cache_queries > 0
    assert stats.engine.prefix_cache_hits > 0  # the second run reused the first one's blocks
    assert stats.engine.requests_with_cached_prefix >= 1
    assert 0 < stats.engine.prefix_cache_hit_ratio <= 1
