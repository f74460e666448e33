"""The token controls of vLLM's servers, on the real engine (the session's tiny model): minimum
lengths, stop token ids, a kept stop string, special tokens, logit bias, prompt truncation; and
GetModelInfo. The tiny model's greedy output is its own: each test first asks for it unbounded,
then checks the control against it."""

from __future__ import annotations

import uuid
from typing import Any

import grpc
import pytest

from services.client import MmgateClient, build_request
from services.proto.mmgate.v1 import inference_pb2 as pb
from tests.services.statuses import violated_fields
from tests.support import RunningServer

EOS = 2  # the tiny model's <|im_end|>, at SmolLM2's id
EOS_TEXT = "<|im_end|>"


async def greedy(client: MmgateClient, prompt: str, **sampling: Any) -> pb.CompleteResponse:
    return await client.complete_request(
        build_request(prompt, raw=True, temperature=0.0, cache_policy="bypass", **sampling)
    )


def fresh() -> str:
    return f"Tell me about {uuid.uuid4().hex[:8]} and the sea"


async def test_a_stop_token_id_ends_the_output_and_min_tokens_holds_it_off(
    client: MmgateClient,
) -> None:
    prompt = fresh()
    free = await greedy(client, prompt, max_tokens=12, ignore_eos=True)
    tokens = list(free.token_ids)
    stop = tokens[3]
    first = tokens.index(stop)
    stopped = await greedy(client, prompt, max_tokens=12, ignore_eos=True, stop_token_ids=[stop])
    assert stopped.final.finish_reason == pb.FINISH_REASON_STOP
    # the stop token ends the token ids (as vLLM reports it); the text leaves it out
    assert list(stopped.token_ids) == tokens[: first + 1]
    assert len(stopped.text) < len(free.text)
    held = await greedy(
        client, prompt, max_tokens=12, ignore_eos=True, stop_token_ids=[stop], min_tokens=first + 2
    )
    assert len(held.token_ids) >= first + 2
    # the stop token is held off (masked) until min_tokens: not among the first of them
    assert list(held.token_ids[:first]) == tokens[:first]
    assert stop not in held.token_ids[: first + 2]


async def test_a_kept_stop_string_ends_the_text(client: MmgateClient) -> None:
    prompt = fresh()
    free = await greedy(client, prompt, max_tokens=12, ignore_eos=True)
    stop = free.text.strip()[-3:]
    assert stop, free.text
    dropped = await greedy(client, prompt, max_tokens=12, ignore_eos=True, stop=[stop])
    kept = await greedy(
        client, prompt, max_tokens=12, ignore_eos=True, stop=[stop], include_stop_str_in_output=True
    )
    assert kept.text.endswith(stop)
    assert not dropped.text.endswith(stop)
    assert kept.text == dropped.text + stop


async def test_logit_bias_forces_a_token_and_special_tokens_show_when_asked(
    client: MmgateClient,
) -> None:
    forced = {"max_tokens": 3, "ignore_eos": True, "logit_bias": {EOS: 100.0}}
    skipped = await greedy(client, fresh(), **forced)
    assert list(skipped.token_ids) == [EOS] * 3
    assert skipped.text == ""  # special tokens are left out by default
    shown = await greedy(client, fresh(), skip_special_tokens=False, **forced)
    assert list(shown.token_ids) == [EOS] * 3
    assert shown.text == EOS_TEXT * 3


async def test_truncation_keeps_the_prompts_last_tokens(client: MmgateClient) -> None:
    prompt = fresh() + " and " + " ".join(["again"] * 40)
    whole = await greedy(client, prompt, max_tokens=4)
    assert whole.final.usage.prompt_tokens > 20
    cut = await greedy(client, prompt, max_tokens=4, truncate_prompt_tokens=20)
    assert cut.final.usage.prompt_tokens == 20
    # the truncated prompt is a prompt of its own: cached under its own key
    first = await client.complete_request(
        build_request(prompt, raw=True, temperature=0.0, max_tokens=2, truncate_prompt_tokens=20)
    )
    again = await client.complete_request(
        build_request(prompt, raw=True, temperature=0.0, max_tokens=2, truncate_prompt_tokens=21)
    )
    outcomes = [
        next(u.outcome for u in r.final.cache.lookups if u.stage == "prompt")
        for r in (first, again)
    ]
    assert outcomes == ["miss", "miss"]


async def test_requests_that_differ_in_a_control_never_share_a_response(
    client: MmgateClient,
) -> None:
    prompt = fresh()

    async def answer(**sampling: Any) -> pb.CompleteResponse:
        return await client.complete_request(
            build_request(
                prompt, raw=True, temperature=0.0, max_tokens=4, cache_policy="response", **sampling
            )
        )

    assert not (await answer(logit_bias={EOS: 1.0})).final.cache.response_from_cache
    assert (await answer(logit_bias={EOS: 1.0})).final.cache.response_from_cache
    for other in ({"logit_bias": {EOS: 2.0}}, {"min_tokens": 2}, {"stop_token_ids": [5]}):
        assert not (await answer(**other)).final.cache.response_from_cache, other


async def test_bad_controls_are_refused_by_field(client: MmgateClient) -> None:
    info = await client.model_info()
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await client.complete_request(
            build_request(
                "Hi",
                max_tokens=4,
                min_tokens=5,
                stop_token_ids=[info.vocab_size],
                logit_bias={3: 101.0},
            )
        )
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert {
        "sampling.min_tokens",
        "sampling.stop_token_ids[0]",
        "sampling.logit_bias[3]",
    } <= set(violated_fields(caught.value))
    assert "Error" not in (caught.value.details() or "")
    # unset max_tokens: min_tokens must fit in what the request may generate
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await client.complete_request(build_request("Hi", min_tokens=info.max_model_len))
    assert "sampling.min_tokens" in violated_fields(caught.value)
    assert (await client.complete("Still serving", max_tokens=1)).final.usage.completion_tokens == 1


async def test_model_info_names_the_model_and_the_limits(
    client: MmgateClient, server: RunningServer
) -> None:
    info = await client.model_info()
    answer = await client.complete("Hi", max_tokens=1)
    assert info.model == answer.final.model
    assert info.max_model_len == 1024  # the test servers' MMGATE_ENGINE__MAX_MODEL_LEN
    assert info.vocab_size > EOS
    assert EOS in info.eos_token_ids
    assert info.bos_token_id == 1
    assert (info.takes_images, info.media_mode) == (False, "none")
    assert info.has_chat_template
    assert info.limits.max_tokens == 1023
    assert info.limits.max_images == 16
    assert info.limits.min_stream_interval == 1
    assert info.limits.max_stop_token_ids == 64
    assert info.limits.max_logit_bias == 300
