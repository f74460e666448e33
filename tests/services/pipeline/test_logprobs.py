"""Log-probabilities through mmgate against vLLM's own for the same greedy request: the session's
in-process server (the tiny LLaVA's language model), asked over gRPC, and its engine asked
directly. Every output token's logprob is <= 0 with at most the asked alternatives, most likely
first; the figures equal vLLM's within 1e-4, for the output and the prompt, streamed and whole."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
import pytest_asyncio

from services.api.server import MmgateServer
from services.client import MmgateClient, build_request, error_reason
from services.proto.mmgate.v1 import inference_pb2 as pb
from tests.services.in_process import vllm_worker

pytestmark = pytest.mark.asyncio(loop_scope="session")

TOP = 5
CLOSE = 1e-4


@pytest_asyncio.fixture(loop_scope="session")
async def client(embeddings_server: MmgateServer) -> AsyncIterator[MmgateClient]:
    async with MmgateClient(f"127.0.0.1:{embeddings_server.port}", timeout=60.0) as client:
        yield client


async def vllm_answer(server: MmgateServer, token_ids: list[int], max_tokens: int) -> Any:
    """vLLM's final output for the greedy request, asked of the engine directly."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    params = SamplingParams(
        temperature=0.0,
        max_tokens=max_tokens,
        ignore_eos=True,
        logprobs=TOP,
        prompt_logprobs=TOP,
        output_kind=RequestOutputKind.FINAL_ONLY,
    )
    engine = vllm_worker(server)._require()
    final = None
    async for output in engine.generate(
        TokensPrompt(prompt_token_ids=token_ids), params, f"test-{uuid.uuid4().hex}"
    ):
        final = output
    assert final is not None
    assert final.finished
    return final


def same(position: pb.TokenLogprobs, token_id: int, expected: dict[int, Any]) -> None:
    """One position as mmgate reported it, against vLLM's dict for it."""
    chosen = expected[token_id]
    assert position.token.token_id == token_id
    assert position.token.logprob <= 0
    assert abs(position.token.logprob - chosen.logprob) < CLOSE
    assert position.token.text == chosen.decoded_token
    top = [lp.logprob for lp in position.top]
    assert len(top) <= TOP
    assert top == sorted(top, reverse=True)
    ranked = sorted(
        ((tid, lp) for tid, lp in expected.items() if lp.rank <= TOP), key=lambda e: e[1].rank
    )
    assert [alt.token_id for alt in position.top] == [tid for tid, _ in ranked]
    for alt, (_, lp) in zip(position.top, ranked, strict=True):
        assert abs(alt.logprob - lp.logprob) < CLOSE


async def test_logprobs_equal_vllms_for_output_and_prompt_streamed_and_whole(
    client: MmgateClient, embeddings_server: MmgateServer
) -> None:
    prompt = f"The weather in {uuid.uuid4().hex[:6]} is"
    request = build_request(
        prompt,
        raw=True,
        temperature=0.0,
        max_tokens=8,
        ignore_eos=True,
        logprobs=TOP,
        prompt_logprobs=TOP,
        cache_policy="bypass",
    )
    ids: list[int] = []
    positions: list[pb.TokenLogprobs] = []
    final = pb.GenerateFinal()
    async for event in client.generate(request):
        if event.HasField("delta"):
            assert len(event.delta.logprobs) == len(event.delta.token_ids)
            ids += event.delta.token_ids
            positions += event.delta.logprobs
        else:
            final = event.final
    prompt_ids = embeddings_server.engine.tokenizer(prompt)["input_ids"]
    expected = await vllm_answer(embeddings_server, prompt_ids, 8)
    completion = expected.outputs[0]
    assert ids == list(completion.token_ids)
    for position, token_id, at in zip(positions, ids, completion.logprobs, strict=True):
        same(position, token_id, at)
    # the prompt: every token after the first
    assert len(final.prompt_logprobs) == len(prompt_ids) - 1 == final.usage.prompt_tokens - 1
    for position, token_id, at in zip(
        final.prompt_logprobs, prompt_ids[1:], expected.prompt_logprobs[1:], strict=True
    ):
        same(position, token_id, at)
    # unary (the engine's final output only): the same figures
    whole = await client.complete_request(request)
    assert list(whole.choices[0].logprobs) == positions
    assert list(whole.final.prompt_logprobs) == list(final.prompt_logprobs)


async def test_no_alternatives_still_gives_each_tokens_logprob(client: MmgateClient) -> None:
    answer = await client.complete_request(
        build_request(
            "Count on", raw=True, temperature=0.0, max_tokens=4, logprobs=0, cache_policy="bypass"
        )
    )
    (choice,) = answer.choices
    assert len(choice.logprobs) == len(choice.token_ids) == answer.final.usage.completion_tokens
    for position, token_id in zip(choice.logprobs, choice.token_ids, strict=True):
        assert position.token.token_id == token_id
        assert position.token.logprob <= 0
        assert not position.top
    assert not answer.final.prompt_logprobs  # none asked for


async def test_an_answer_past_the_send_limit_is_refused_in_mmgates_words_and_streams_whole(
    client: MmgateClient, embeddings_server: MmgateServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the server sends at most twice max_message_bytes in one message: 20 KB here
    monkeypatch.setattr(embeddings_server.settings, "max_message_bytes", 10_000)
    request = build_request(
        "Once upon a time",
        raw=True,
        temperature=1.0,
        n=4,
        max_tokens=40,
        ignore_eos=True,
        logprobs=20,
        cache_policy="bypass",
    )
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await client.complete_request(request)
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert error_reason(caught.value) == "ANSWER_TOO_LARGE"
    assert "stream it with Generate" in (caught.value.details() or "")
    # streamed, each message is small: the same request goes through whole
    tokens = 0
    async for event in client.generate(request):
        if event.HasField("delta"):
            assert len(event.delta.logprobs) == len(event.delta.token_ids)
            tokens += len(event.delta.token_ids)
    assert tokens == 160
