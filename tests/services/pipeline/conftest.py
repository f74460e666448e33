"""The pipeline's in-process server: a real mmgate server in this process (so a test can reach
into its media pipeline) on the tiny LLaVA in embeddings mode, real vLLM, real gRPC over
loopback. test_images and test_placeholder_tokens share it: each test asks with images of its
own seeds, and counts are deltas.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from services.api.server import MmgateServer
from services.config import Settings
from services.models import build_tiny_llava, engine_settings


@pytest.fixture(scope="package")
def llava_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_llava(tmp_path_factory.mktemp("models") / "tiny-llava")


@pytest_asyncio.fixture(scope="package", loop_scope="package")
async def embeddings_server(llava_model: Path) -> AsyncIterator[MmgateServer]:
    settings = Settings(
        port=0,
        engine=engine_settings(llava_model),
        metrics={"port": 0},
        max_concurrent_requests=16,
        # one decode at a time: a burst of large images queues there (and only there)
        threads={"decode": 1},
        # the package's loop stands still while other modules' tests run: that is no block of
        # this server's loop for its health to report
        health={"loop_block_seconds": 3600},
    )
    running = MmgateServer(settings, model=str(llava_model))
    try:
        await running.start()
        yield running
    finally:
        await running.stop(grace=5)
