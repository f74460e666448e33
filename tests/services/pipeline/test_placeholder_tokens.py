"""The tokens an image placeholder takes, as the media stage tells the token budget, against what
vLLM itself reports for an image request; and what a stored image weighs: in both media modes (a
real engine on the tiny LLaVA)."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from services.api.server import MmgateServer
from services.api.validation import validate
from services.client import MmgateClient, build_request, digest_of
from services.config import Settings
from services.models import engine_settings
from services.pipeline.media import PixelsStage
from services.pipeline.prompts import render

from ..imagegen import encoded, large_png, picture, png, variant

pytestmark = pytest.mark.asyncio(loop_scope="session")


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def pixels_server(tiny_llava: Path) -> AsyncIterator[MmgateServer]:
    settings = Settings(
        port=0,
        engine=engine_settings(tiny_llava),
        media={"mode": "pixels"},
        metrics={"enabled": False},
    )
    running = MmgateServer(settings, model=str(tiny_llava))
    try:
        await running.start()
        yield running
    finally:
        await running.stop(grace=5)


@pytest.fixture(scope="module", params=["pixels", "embeddings"])
def server(request: pytest.FixtureRequest) -> MmgateServer:
    """A server of its own in pixels mode; in embeddings mode the session's in-process one
    (tests/services/in_process.py)."""
    running: MmgateServer = request.getfixturevalue(f"{request.param}_server")
    assert running.pipeline.media.mode == request.param
    return running


@pytest.mark.parametrize("images", [1, 3])
async def test_the_budget_counts_image_tokens_as_the_engine_does(
    server: MmgateServer, images: int
) -> None:
    request = build_request(
        "What is in the pictures?", images=[png(6600 + i) for i in range(images)], max_tokens=2
    )
    async with MmgateClient(f"127.0.0.1:{server.port}", timeout=60.0) as client:
        answer = await client.complete_request(request)
    checked = validate(
        request, server.settings, max_model_len=server.engine.max_model_len, takes_images=True
    )
    rendered = await render(server.pipeline.prompts.tokenizers, checked, server.pipeline.threads)
    media = server.pipeline.media
    # what vLLM ran: each placeholder expanded to the image's tokens
    expected = len(rendered.token_ids) + images * (media.placeholder_tokens - 1)
    assert answer.final.usage.prompt_tokens == expected
    assert media.placeholder_tokens == 16  # 56x56 pixels in 14-pixel patches


async def stage_bytes(client: MmgateClient, digest: str, stage: str) -> int:
    stages = {entry.stage: entry for entry in (await client.inspect(digest=digest)).stages}
    entry = stages.get(stage)
    return int(entry.bytes) if entry is not None and entry.state == "stored" else 0


async def test_a_large_image_is_stored_at_the_processor_size_for_the_same_answer(
    server: MmgateServer,
) -> None:
    """1200x900 pixels are stored as the processor's 74x56 (its shortest edge is 56): 250 times
    less, and greedy tokens identical to those from the image stored as decoded."""
    data = encoded(picture(77, (1200, 900)))
    digest = digest_of(data)
    request = build_request("Describe it", images=[data], max_tokens=16, temperature=0.0)
    request.sampling.ignore_eos = True
    media = server.pipeline.media
    assert isinstance(media, PixelsStage)
    assert media.context.shrink is not None  # the tiny LLaVA's CLIP processor: fixed resolution
    async with MmgateClient(f"127.0.0.1:{server.port}", timeout=60.0) as client:
        shrunk = await client.complete_request(request)
        assert await stage_bytes(client, digest, "image") == 74 * 56 * 3

        shrinking, media.context = media.context, dataclasses.replace(media.context, shrink=None)
        try:
            # forget the image everywhere: mmgate's stages and vLLM's own caches
            assert await client.invalidate(digest=digest)
            await server.engine.forget_media()
            whole = await client.complete_request(request)
            assert await stage_bytes(client, digest, "image") == 1200 * 900 * 3
        finally:
            media.context = shrinking
            await client.invalidate(digest=digest)
    assert len(shrunk.token_ids) == 16
    assert list(shrunk.token_ids) == list(whole.token_ids)


async def test_one_huge_image_is_served_but_does_not_flush_the_cache(
    server: MmgateServer,
) -> None:
    """Stored as decoded (a dynamic-resolution model), 36 megapixels weigh 108 MB: more than
    max_entry_fraction (0.05) of the 512 MiB budget, so served and not stored, and the images
    others stored stay."""
    media = server.pipeline.media
    assert isinstance(media, PixelsStage)
    assert server.cache.config.max_entry_fraction == 0.05
    small = [png(6700 + i) for i in range(3)]
    shrinking, media.context = media.context, dataclasses.replace(media.context, shrink=None)
    try:
        async with MmgateClient(f"127.0.0.1:{server.port}", timeout=120.0) as client:
            for data in small:
                await client.complete_request(build_request("Hi", images=[data], max_tokens=1))
            huge = variant(large_png(), 1)
            answer = await client.complete_request(build_request("Hi", images=[huge], max_tokens=1))
            assert answer.final.usage.completion_tokens == 1
            assert await stage_bytes(client, digest_of(huge), "image") == 0  # not stored
            for data in small:  # and nobody else's images were evicted for it
                assert await stage_bytes(client, digest_of(data), "image") > 0
    finally:
        media.context = shrinking
