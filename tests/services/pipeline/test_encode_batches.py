"""Batched encodes end to end, on the session's in-process server (the tiny LLaVA in embeddings
mode, one encode thread): images of different requests that wait for the encoder together run in
one forward pass, and every request gets the answer it gets when its image is encoded alone."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest
import pytest_asyncio

from services.api.server import MmgateServer
from services.client import MmgateClient, build_request, digest_of
from services.pipeline.media import EmbeddingsStage
from services.proto.mmgate.v1 import inference_pb2 as pb

from ..imagegen import png
from ..in_process import InProcess, finished

pytestmark = pytest.mark.asyncio(loop_scope="session")

HOLD = 30.0  # seconds the held encoder run waits for the test at most


@pytest_asyncio.fixture(loop_scope="session")
async def client(embeddings_server: MmgateServer) -> AsyncIterator[MmgateClient]:
    async with MmgateClient(f"127.0.0.1:{embeddings_server.port}", timeout=60.0) as client:
        yield client


def ask(data: bytes) -> pb.GenerateRequest:
    return build_request("What is in the picture?", images=[data], max_tokens=8, temperature=0.0)


async def test_images_waiting_together_run_in_one_batch_with_the_answers_of_single_encodes(
    llava_in_process: InProcess, client: MmgateClient
) -> None:
    stage = llava_in_process.server.pipeline.media
    assert isinstance(stage, EmbeddingsStage)
    batcher = stage.batcher
    images = [png(7100 + i) for i in range(4)]
    # each image encoded alone, then forgotten so that it is encoded again below
    alone = [await client.complete_request(ask(data)) for data in images]
    for data in images:
        assert await client.invalidate(digest=digest_of(data))

    real = batcher._encode
    started, go = threading.Event(), threading.Event()

    def first_run_held(batch: Sequence[Any]) -> Any:
        if not started.is_set():
            started.set()
            assert go.wait(HOLD)
        return real(batch)

    batcher._encode = first_run_held
    before = (await client.stats()).media
    try:
        first = asyncio.ensure_future(client.complete_request(ask(images[0])))
        assert await asyncio.to_thread(started.wait, HOLD)
        rest = [asyncio.ensure_future(client.complete_request(ask(data))) for data in images[1:]]
        async with asyncio.timeout(HOLD):
            while len(batcher._waiting) < len(rest):  # noqa: ASYNC110 - requests on this loop
                await asyncio.sleep(0.01)
        go.set()
        together = [await first, *[await call for call in rest]]
    finally:
        go.set()
        batcher._encode = real
    after = (await client.stats()).media
    assert after.encodes - before.encodes == 4
    assert after.encode_batches - before.encode_batches == 2  # the held one, then the 3
    for single, batched in zip(alone, together, strict=True):
        assert batched.final.cache.images[0].outcome == "miss"
        assert batched.token_ids == single.token_ids
    # each image's own span says how many ran with it
    sizes = [
        s.attributes.get("mmgate.encode.batch")
        for s in finished(llava_in_process.exporter)[-200:]
        if s.name == "media.encode" and s.attributes is not None and s.end_time is not None
    ]
    assert sizes.count(3) >= 3
