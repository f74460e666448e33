"""The embedded default model, end to end: prepared from its package, served by the real engine,
asked through the real CLI."""

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.client import MmgateClient
from tests.support import ROOT, RunningServer, start_server


def mmgate(*args: str, timeout: float = 300) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "services.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


@pytest.fixture(scope="module")
def default_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    # `mmgate models prepare` converts once into the model cache (MMGATE_MODEL_CACHE, or the
    # user's cache folder) and is instant afterwards
    prepared = Path(mmgate("models", "prepare").strip())
    assert (prepared / "config.json").is_file()
    server = start_server(tmp_path_factory.mktemp("default-model"), None)
    yield server
    assert server.stop() == 0, server.log()


def test_cli_answers_the_capital_of_france(default_server: RunningServer) -> None:
    answer = mmgate("generate", "What is the capital of France?", "--target", default_server.target)
    assert "Paris" in answer


async def test_streamed_chat_answer(default_server: RunningServer) -> None:
    async with MmgateClient(default_server.target) as client:
        text = "".join(
            [
                piece
                async for piece in client.stream_text(
                    "What is the capital of France?", max_tokens=32, temperature=0.0
                )
            ]
        )
        stats = await client.stats()
    assert "Paris" in text
    assert stats.model == "SmolLM2-135M-Instruct"
