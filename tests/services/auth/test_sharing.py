"""Sharing between tenants, where a single organisation turns it on: with both settings set,
tenant B does get A's image from the cache and A's prefix from vLLM's prefix cache (so the
isolation tests, which find neither, would see a leak)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from services.models import build_tiny_llava
from tests.services.imagegen import png
from tests.support import RunningServer, start_server

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest.fixture(scope="module")
def sharing_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    model = build_tiny_llava(tmp_path_factory.mktemp("models") / "tiny-llava")
    running = start_server(
        tmp_path_factory.mktemp("sharing"),
        str(model),
        MMGATE_MEDIA__MODE="pixels",
        MMGATE_TENANTS__SHARE_MEDIA="true",
        MMGATE_TENANTS__SHARE_PREFIX="true",
        MMGATE_ENGINE__MAX_MODEL_LEN="2048",
    )
    yield running
    assert running.stop() == 0, running.log()


async def test_shared_media_and_prefixes_are_shared(sharing_server: RunningServer) -> None:
    image = png(8181)
    text = "<image> " + " ".join(f"Shared clause {i} of the common prompt." for i in range(40))
    options: dict[str, Any] = {"max_tokens": 1, "temperature": 0.0, "raw": True}
    async with (
        sharing_server.client(tenant="alpha") as alpha,
        sharing_server.client(tenant="beta") as beta,
    ):
        await alpha.complete(text, images=[image], **options)
        theirs = await beta.complete(text, images=[image], **options)
    assert theirs.final.cache.images[0].outcome == "hit"
    assert theirs.final.usage.cached_prompt_tokens >= 128
