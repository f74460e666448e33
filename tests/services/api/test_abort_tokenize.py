"""Inference.Abort, Tokenize and Detokenize against the real engine (``mmgate serve`` over
SmolLM2): an aborted request's engine run stops; Tokenize gives what the engine is given."""

from __future__ import annotations

import grpc
import pytest

from services.client import MmgateClient, build_request
from services.client.requests import error_reason
from services.proto.mmgate.v1 import inference_pb2 as pb
from tests.services.api.test_cancel import settled_engine
from tests.support import (
    RunningServer,
    engine_core,
    engine_in_flight,
    eventually,
    hand_to_stopped_core,
)


async def test_abort_ends_the_callers_request_and_its_engine_run(
    server: RunningServer, client: MmgateClient
) -> None:
    before = await settled_engine(client)
    request = build_request(
        "Long story", max_tokens=900, ignore_eos=True, temperature=0.0, request_id="story-17"
    )
    core = engine_core(server)
    assert core is not None, server.log()
    try:
        call = await hand_to_stopped_core(core, client, request)
        assert await client.abort("story-17", "never-sent") == ["story-17"]
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            async for _ in call:
                pass
        await eventually(engine_in_flight(client, 0), timeout=30)
    finally:
        core.resume()
    assert caught.value.code() == grpc.StatusCode.CANCELLED
    assert error_reason(caught.value) == "REQUEST_ABORTED"
    assert caught.value.details() == "the request was aborted (Inference.Abort)"
    after = await settled_engine(client)
    assert after.running == 0
    assert after.aborted == before.aborted + 1
    # ended: nothing of that id is left to abort, and the server serves on
    with pytest.raises(grpc.aio.AioRpcError) as gone:
        await client.abort("story-17")
    assert gone.value.code() == grpc.StatusCode.NOT_FOUND
    assert error_reason(gone.value) == "REQUEST_NOT_FOUND"
    assert (await client.complete("Hi", max_tokens=2)).final.usage.completion_tokens == 2


async def test_abort_refuses_more_ids_than_its_limit(client: MmgateClient) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await client.abort(*(f"id-{k}" for k in range(1025)))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details() == "request_ids: 1025 ids; the limit is 1024"


async def last(client: MmgateClient, request: pb.GenerateRequest) -> pb.GenerateFinal:
    final = None
    async for message in client.generate(request):
        if message.HasField("final"):
            final = message.final
    assert final is not None
    return final


@pytest.mark.parametrize(
    "given",
    [
        {"messages": [("system", "You answer in one word."), ("user", "Name a colour.")]},
        {"prompt": "The capital of France is", "raw": True},
    ],
    ids=["chat", "prompt"],
)
async def test_tokenize_gives_the_ids_the_engine_is_given(
    client: MmgateClient, given: dict[str, object]
) -> None:
    ids = await client.tokenize(**given)  # type: ignore[arg-type]
    # the engine's own record of the prompt it ran: each position's token after the first
    final = await last(
        client,
        build_request(**given, max_tokens=1, temperature=0.0, prompt_logprobs=0),  # type: ignore[arg-type]
    )
    assert final.usage.prompt_tokens == len(ids)
    assert [position.token.token_id for position in final.prompt_logprobs] == ids[1:]
    text = await client.detokenize(ids)
    assert ("Name a colour." if "messages" in given else "The capital of France is") in text


async def test_tokenize_and_detokenize_refuse_bad_input_in_mmgates_words(
    client: MmgateClient,
) -> None:
    info = await client.model_info()
    longest = info.max_model_len
    cases = [
        (
            client.inference.Tokenize(pb.TokenizeRequest(), timeout=10),
            "input: set prompt or chat",
        ),
        (
            client.inference.Detokenize(
                pb.DetokenizeRequest(token_ids=[1, info.vocab_size]), timeout=10
            ),
            f"token_ids[1]: {info.vocab_size} is not below the vocabulary's {info.vocab_size}",
        ),
        (
            client.inference.Detokenize(pb.DetokenizeRequest(), timeout=10),
            "token_ids: must hold at least one token id",
        ),
        (
            client.inference.Detokenize(
                pb.DetokenizeRequest(token_ids=[1] * info.max_model_len), timeout=10
            ),
            f"token_ids: {longest} tokens; the model takes at most {longest - 1}",
        ),
    ]
    for call, said in cases:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await call
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert caught.value.details() == said
    assert await client.detokenize(await client.tokenize("Hello", raw=True)) == "Hello"
