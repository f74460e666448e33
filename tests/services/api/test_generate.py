"""Streaming and unary generation through the real server and the real engine."""

import asyncio
from typing import Any

from services.client import MmgateClient, SyncClient, build_request
from services.proto.mmgate.v1 import inference_pb2 as pb
from tests.support import RunningServer


async def collect(client: MmgateClient, request: pb.GenerateRequest) -> list[pb.GenerateResponse]:
    return [event async for event in client.generate(request)]


async def test_stream_ends_with_one_final(client: MmgateClient) -> None:
    request = build_request("Hello there", max_tokens=12, temperature=0.0, request_id="req-1")
    events = await collect(client, request)
    deltas, final = events[:-1], events[-1]
    assert deltas
    assert all(e.HasField("delta") for e in deltas)
    assert final.HasField("final")
    f = final.final
    assert f.request_id == "req-1"
    assert f.model == "tiny"
    assert f.finish_reason in (pb.FINISH_REASON_STOP, pb.FINISH_REASON_LENGTH)
    assert f.usage.prompt_tokens > 0
    assert f.usage.completion_tokens == sum(len(e.delta.token_ids) for e in deltas)
    assert 1 <= f.usage.completion_tokens <= 12


async def test_max_tokens_is_honoured(client: MmgateClient) -> None:
    request = build_request("Count", max_tokens=7, ignore_eos=True, temperature=0.0)
    final = (await collect(client, request))[-1].final
    assert final.usage.completion_tokens == 7
    assert final.finish_reason == pb.FINISH_REASON_LENGTH


async def test_unary_equals_the_stream(client: MmgateClient) -> None:
    options: dict[str, Any] = {"max_tokens": 16, "temperature": 0.0, "ignore_eos": True}
    streamed = await collect(client, build_request("Tell me about cats", **options))
    text = "".join(e.delta.text for e in streamed[:-1])
    ids = [i for e in streamed[:-1] for i in e.delta.token_ids]
    complete = await client.complete("Tell me about cats", **options)
    assert (complete.text, list(complete.token_ids)) == (text, ids)
    assert complete.final.usage.completion_tokens == 16


async def test_a_stream_interval_sends_the_same_tokens_in_fewer_messages(
    client: MmgateClient,
) -> None:
    options: dict[str, Any] = {"max_tokens": 10, "temperature": 0.0, "ignore_eos": True}
    one = await collect(client, build_request("Tell me about dogs", **options))
    grouped = await collect(
        client, build_request("Tell me about dogs", stream_interval=4, **options)
    )
    sizes = [len(e.delta.token_ids) for e in grouped[:-1]]
    # vLLM sends the first token at once, then groups of 4, then the rest: [1, 4, 4, 1] (fewer,
    # larger ones where the server's reader fell behind and vLLM merged them)
    assert sum(sizes) == 10
    assert len(sizes) <= 4
    assert [i for e in grouped[:-1] for i in e.delta.token_ids] == [
        i for e in one[:-1] for i in e.delta.token_ids
    ]
    assert "".join(e.delta.text for e in grouped[:-1]) == "".join(e.delta.text for e in one[:-1])
    assert grouped[-1].final.usage.completion_tokens == 10


async def test_raw_prompt(client: MmgateClient) -> None:
    complete = await client.complete("Once upon a time", raw=True, max_tokens=5, ignore_eos=True)
    assert complete.final.usage.completion_tokens == 5


async def test_sixteen_concurrent_streams(client: MmgateClient) -> None:
    requests = [
        build_request(f"Question number {i}", max_tokens=24, ignore_eos=True, temperature=0.0)
        for i in range(16)
    ]
    results = await asyncio.gather(*(collect(client, r) for r in requests))
    finals = [events[-1].final for events in results]
    assert [f.usage.completion_tokens for f in finals] == [24] * 16
    assert len({f.request_id for f in finals}) == 16


async def test_greedy_is_repeatable_and_seeded_sampling_too(client: MmgateClient) -> None:
    greedy = [
        await client.complete("Same words", max_tokens=10, temperature=0.0, ignore_eos=True)
        for _ in range(2)
    ]
    assert greedy[0].text == greedy[1].text
    seeded = [
        await client.complete("Same words", max_tokens=10, temperature=1.0, seed=7, ignore_eos=True)
        for _ in range(2)
    ]
    assert seeded[0].token_ids == seeded[1].token_ids


async def test_sync_client(server: RunningServer) -> None:

    def ask() -> tuple[str, str, int]:
        with SyncClient(server.target, timeout=60) as sync:
            streamed = "".join(sync.stream_text("Hi", max_tokens=6, temperature=0.0))
            complete = sync.complete("Hi", max_tokens=6, temperature=0.0)
            return streamed, complete.text, sync.stats().engine.requests

    streamed, completed, requests = await asyncio.to_thread(ask)
    assert streamed == completed
    assert requests > 0
