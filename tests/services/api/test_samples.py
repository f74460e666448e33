"""Several samples, log-probabilities and token-id prompts on the real engine (the session's tiny
model): n samples stream indexed and end each with its own reason, a seeded request gives the
same samples twice and the same in a unary call (which asks the engine for its final output
only) as streamed; a prompt sent as token ids gives the text prompt's greedy answer; every new
field out of bounds is INVALID_ARGUMENT naming it. The log-probabilities against vLLM's own for
the same request are in tests/services/pipeline/test_logprobs.py (an engine in this process)."""

from __future__ import annotations

import uuid
from collections import defaultdict
from typing import Any

import grpc
import pytest
from transformers import AutoTokenizer

from services.client import MmgateClient, build_request
from services.proto.mmgate.v1 import inference_pb2 as pb
from tests.services.statuses import violated_fields

ENDS = {pb.FINISH_REASON_STOP, pb.FINISH_REASON_LENGTH}


def fresh() -> str:
    return f"Tell me about {uuid.uuid4().hex[:8]} and the hills"


async def streamed(
    client: MmgateClient, request: pb.GenerateRequest
) -> tuple[dict[int, list[int]], dict[int, str], pb.GenerateFinal, list[int]]:
    """Each sample's token ids and text, the final message, and the order samples came in."""
    ids: dict[int, list[int]] = defaultdict(list)
    texts: dict[int, str] = defaultdict(str)
    order: list[int] = []
    final = pb.GenerateFinal()
    async for event in client.generate(request):
        if event.HasField("delta"):
            ids[event.delta.index] += event.delta.token_ids
            texts[event.delta.index] += event.delta.text
            order.append(event.delta.index)
        else:
            final = event.final
    return ids, texts, final, order


def sampled(prompt: str, **sampling: Any) -> pb.GenerateRequest:
    return build_request(
        prompt, raw=True, temperature=1.0, cache_policy="bypass", ignore_eos=True, **sampling
    )


async def test_four_samples_stream_indexed_each_with_its_end(client: MmgateClient) -> None:
    ids, _, final, order = await streamed(client, sampled(fresh(), n=4, max_tokens=12))
    assert sorted(ids) == [0, 1, 2, 3]
    # interleaved: the engine steps the four together, not one after another
    assert order.index(3) < len(order) - order[::-1].index(0) - 1
    assert [end.index for end in final.samples] == [0, 1, 2, 3]
    for end in final.samples:
        assert end.finish_reason == pb.FINISH_REASON_LENGTH
        assert end.completion_tokens == len(ids[end.index]) == 12
    assert final.usage.completion_tokens == 48
    assert final.finish_reason == final.samples[0].finish_reason
    # sampled at temperature 1: not one answer four times
    assert len({tuple(i) for i in ids.values()}) > 1


async def test_a_seeded_request_gives_the_same_samples_twice_streamed_or_whole(
    client: MmgateClient,
) -> None:
    request = sampled(fresh(), n=4, max_tokens=10, seed=1234)
    first, texts, _, _ = await streamed(client, request)
    second, _, _, _ = await streamed(client, request)
    assert first == second
    # unary: the engine's final output only, the same four samples (and the same text)
    whole = await client.complete_request(request)
    assert [c.index for c in whole.choices] == [0, 1, 2, 3]
    assert {c.index: list(c.token_ids) for c in whole.choices} == first
    assert {c.index: c.text for c in whole.choices} == texts
    assert (whole.text, list(whole.token_ids)) == (texts[0], first[0])
    assert all(c.end.finish_reason in ENDS for c in whole.choices)
    assert whole.final.usage.completion_tokens == 40
    assert not any(c.logprobs for c in whole.choices)  # none asked for


async def test_a_stop_string_is_reported_for_the_sample_it_ended(client: MmgateClient) -> None:
    prompt = fresh()
    free = await client.complete_request(
        build_request(prompt, raw=True, temperature=0.0, max_tokens=12, ignore_eos=True)
    )
    stop = free.text.strip()[-2:]
    assert stop, free.text
    stopped = await client.complete_request(
        build_request(prompt, raw=True, temperature=0.0, max_tokens=12, stop=[stop])
    )
    (end,) = stopped.final.samples
    assert end.finish_reason == pb.FINISH_REASON_STOP
    assert (end.WhichOneof("stop"), end.stop_string) == ("stop_string", stop)
    tokens = list(free.token_ids)
    by_id = await client.complete_request(
        build_request(prompt, raw=True, temperature=0.0, max_tokens=12, stop_token_ids=[tokens[2]])
    )
    assert by_id.choices[0].end.stop_token_id == tokens[2]


async def test_a_prompt_sent_as_token_ids_gives_the_texts_greedy_answer(
    client: MmgateClient, tiny_model: str
) -> None:
    prompt = fresh()
    ids = AutoTokenizer.from_pretrained(tiny_model)(prompt)["input_ids"]
    as_text = await client.complete_request(
        build_request(prompt, raw=True, temperature=0.0, max_tokens=10, ignore_eos=True)
    )
    as_ids = await client.complete_request(
        build_request(token_ids=ids, temperature=0.0, max_tokens=10, ignore_eos=True)
    )
    assert list(as_ids.token_ids) == list(as_text.token_ids)
    assert as_ids.text == as_text.text
    assert as_ids.final.usage.prompt_tokens == len(ids) == as_text.final.usage.prompt_tokens
    # nothing rendered or tokenized, so nothing looked up
    (lookup,) = [up for up in as_ids.final.cache.lookups if up.stage == "prompt"]
    assert (lookup.outcome, lookup.key) == ("bypass", "")
    # truncated as a text prompt is: its last tokens
    cut = await client.complete_request(
        build_request(token_ids=ids, temperature=0.0, max_tokens=2, truncate_prompt_tokens=3)
    )
    assert cut.final.usage.prompt_tokens == 3


async def test_new_fields_out_of_bounds_are_refused_by_name(client: MmgateClient) -> None:
    info = await client.model_info()
    assert (info.limits.max_samples, info.limits.max_logprobs) == (8, 20)
    vocab, context = info.vocab_size, info.max_model_len
    cases: list[tuple[pb.GenerateRequest, set[str]]] = [
        (build_request("Hi", n=0, temperature=1.0), {"sampling.n"}),
        (build_request("Hi", n=9, temperature=1.0), {"sampling.n"}),
        (build_request("Hi", n=2, temperature=0.0), {"sampling.n"}),
        (build_request("Hi", logprobs=21), {"sampling.logprobs"}),
        (build_request("Hi", prompt_logprobs=21), {"sampling.prompt_logprobs"}),
        (build_request(token_ids=[]), {"token_ids.ids"}),
        (build_request(token_ids=[5, 6, 7, vocab, 8]), {"token_ids.ids[3]"}),
        (build_request(token_ids=[5] * context), {"token_ids.ids"}),
        (build_request(token_ids=[5] * (context - 4), max_tokens=8), {"sampling.max_tokens"}),
    ]
    for request, fields in cases:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await client.complete_request(request)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, fields
        assert fields <= violated_fields(caught.value), (fields, caught.value.details())
        assert "Error" not in (caught.value.details() or "")
    assert (await client.complete("Still serving", max_tokens=1)).final.usage.completion_tokens == 1
