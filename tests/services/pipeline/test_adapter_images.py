"""An image request through a LoRA adapter of the tiny LLaVA, in embeddings mode: mmgate runs the
vision tower and projector, the engine the language model with the adapter."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest
import pytest_asyncio
from google.rpc import error_details_pb2

from services.api.server import MmgateServer
from services.client import MmgateClient, build_request
from services.proto.mmgate.v1 import inference_pb2 as pb
from tests.services.statuses import error_details

from ..imagegen import png
from ..in_process import InProcess

pytestmark = pytest.mark.asyncio(loop_scope="session")


@pytest_asyncio.fixture(loop_scope="session")
async def client(embeddings_server: MmgateServer) -> AsyncIterator[MmgateClient]:
    async with MmgateClient(f"127.0.0.1:{embeddings_server.port}", timeout=60.0) as client:
        yield client


def ask(image: bytes, adapter: str = "") -> pb.GenerateRequest:
    return build_request(
        "What is in the picture?",
        images=[image],
        adapter=adapter,
        max_tokens=8,
        temperature=0.0,
        cache_policy="bypass",
    )


async def test_an_image_request_through_an_adapter(
    client: MmgateClient, llava_in_process: InProcess
) -> None:
    image = png(4301)
    base = await client.complete_request(ask(image))
    adapted = await client.complete_request(ask(image, "lm"))
    again = await client.complete_request(ask(image, "lm"))
    assert adapted.final.adapter.name == "lm"
    assert adapted.token_ids != base.token_ids
    assert again.token_ids == adapted.token_ids
    # the image was encoded once, by mmgate, for all three: the adapter is the engine's
    assert [r.final.cache.images[0].outcome for r in (base, adapted, again)] == [
        "miss",
        "hit",
        "hit",
    ]
    # the engine spans say which adapter answered
    engine = await llava_in_process.watch.until(
        lambda spans: [s for s in spans if (s.attributes or {}).get("mmgate.adapter") == "lm"]
    )
    assert engine[0].name.startswith("text_completion")


async def test_an_adapter_of_the_vision_tower_is_refused_in_embeddings_mode(
    client: MmgateClient,
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await client.load_adapter("tower", "vision")
    error = caught.value
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "outside the language model" in error.details()
    reasons = [d.reason for d in error_details(error) if isinstance(d, error_details_pb2.ErrorInfo)]
    assert reasons == ["ADAPTER_REFUSED"]
    info = await client.model_info()
    assert [a.name for a in info.adapters] == ["lm"]
