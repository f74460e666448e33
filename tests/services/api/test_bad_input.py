"""Bad input gets INVALID_ARGUMENT naming the field, never reaches the engine, and the server
keeps serving."""

import grpc
import pytest

from services.client import MmgateClient, build_request
from services.proto.mmgate.v1 import inference_pb2 as pb
from tests.services.statuses import violated_fields

from ..imagegen import png


def chat_request(**sampling: object) -> pb.GenerateRequest:
    return build_request("Hi", **sampling)  # type: ignore[arg-type]


def with_unknown_chat_field() -> pb.GenerateRequest:
    # field 9 of ChatMessage, which this server does not know
    message = pb.ChatMessage.FromString(
        pb.ChatMessage(role="user", content="hi").SerializeToString() + b"\x4a\x04name"
    )
    return pb.GenerateRequest(chat=pb.Chat(messages=[message]))


CASES = {
    "empty input": (pb.GenerateRequest(), "input"),
    "empty prompt": (pb.GenerateRequest(prompt=" "), "prompt"),
    "no chat messages": (pb.GenerateRequest(chat=pb.Chat()), "chat.messages"),
    "unknown role": (build_request(messages=[("robot", "hi")]), "chat.messages[0].role"),
    "unknown chat field": (with_unknown_chat_field(), "chat.messages[0]"),
    "negative temperature": (chat_request(temperature=-1.0), "sampling.temperature"),
    "top_p above one": (chat_request(top_p=1.5), "sampling.top_p"),
    "zero max_tokens": (chat_request(max_tokens=0), "sampling.max_tokens"),
    "max_tokens beyond the context": (chat_request(max_tokens=1020), "sampling.max_tokens"),
    "over-long prompt (tokens)": (pb.GenerateRequest(prompt="word " * 2000), "prompt"),
    "over-long prompt (characters)": (pb.GenerateRequest(prompt="x" * 300_000), "prompt"),
}


@pytest.mark.parametrize("case", sorted(CASES))
async def test_bad_input_is_refused_with_the_field(client: MmgateClient, case: str) -> None:
    request, field = CASES[case]
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await client.complete_request(request)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caught.value.details()
    assert field in violated_fields(caught.value)
    assert field in (caught.value.details() or "")


async def test_oversized_message(client: MmgateClient) -> None:
    request = pb.GenerateRequest(prompt="y" * (5 * 1024 * 1024))  # limit: 4 MiB
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await client.complete_request(request)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "request" in violated_fields(caught.value)


async def test_far_oversized_message_is_refused_by_grpc(client: MmgateClient) -> None:
    request = pb.GenerateRequest(prompt="z" * (9 * 1024 * 1024))  # beyond twice the limit
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await client.complete_request(request)
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


async def test_bad_requests_reach_neither_cache_nor_engine(client: MmgateClient) -> None:
    before = await client.stats()
    for request, _ in CASES.values():
        with pytest.raises(grpc.aio.AioRpcError):
            await client.complete_request(request)
    after = await client.stats()
    assert after.engine.requests == before.engine.requests
    # only the token-count check needs the tokenized prompt; nothing else touched the cache
    assert after.actor.misses + after.actor.hits - (before.actor.misses + before.actor.hits) <= 2
    answer = await client.complete("Still there?", max_tokens=3, ignore_eos=True)
    assert answer.final.usage.completion_tokens == 3


async def test_a_text_model_refuses_images_before_any_image_work(client: MmgateClient) -> None:
    stats = await client.stats()
    assert stats.media_mode == "none"
    request = build_request("What is this?", images=[png(1)], max_tokens=4)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await client.complete_request(request)
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert stats.model in (caught.value.details() or "")
    with pytest.raises(grpc.aio.AioRpcError) as prefetched:
        await client.prefetch(png(2))
    assert prefetched.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    after = await client.stats()
    assert after.media.decodes == after.media.rejected == 0
    assert after.actor.misses == stats.actor.misses  # not even the prompt was looked up
