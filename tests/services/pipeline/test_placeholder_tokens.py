"""The tokens an image placeholder takes, as the media stage tells the token budget, against what
vLLM itself reports for an image request: in both media modes (a real engine on the tiny LLaVA)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from services.api.server import MmgateServer
from services.api.validation import validate
from services.client import MmgateClient, build_request
from services.config import Settings
from services.models import build_tiny_llava, engine_settings
from services.pipeline.prompts import render

from ..imagegen import png

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest.fixture(scope="module")
def llava_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_llava(tmp_path_factory.mktemp("models") / "tiny-llava")


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=["pixels", "embeddings"])
async def server(request: pytest.FixtureRequest, llava_model: Path) -> AsyncIterator[MmgateServer]:
    settings = Settings(
        port=0,
        engine=engine_settings(llava_model),
        media={"mode": request.param},
        metrics={"enabled": False},
    )
    running = MmgateServer(settings, model=str(llava_model))
    try:
        await running.start()
        assert running.pipeline.media.mode == request.param
        yield running
    finally:
        await running.stop(grace=5)


@pytest.mark.parametrize("images", [1, 3])
async def test_the_budget_counts_image_tokens_as_the_engine_does(
    server: MmgateServer, images: int
) -> None:
    request = build_request(
        "What is in the pictures?", images=[png(600 + i) for i in range(images)], max_tokens=2
    )
    async with MmgateClient(f"127.0.0.1:{server.port}", timeout=60.0) as client:
        answer = await client.complete_request(request)
    checked = validate(
        request, server.settings, max_model_len=server.engine.max_model_len, takes_images=True
    )
    rendered = await render(server.engine.tokenizer, checked, server.pipeline.threads)
    media = server.pipeline.media
    # what vLLM ran: each placeholder expanded to the image's tokens
    expected = len(rendered.token_ids) + images * (media.placeholder_tokens - 1)
    assert answer.final.usage.prompt_tokens == expected
    assert media.placeholder_tokens == 16  # 56x56 pixels in 14-pixel patches
