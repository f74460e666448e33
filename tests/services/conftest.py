"""Real servers for the service tests: `mmgate serve` in a child process, real vLLM, loopback gRPC.

One server on the tiny test model serves the whole session (engine start takes seconds), and the
shutdown test, last, stops it; tests that need other settings or the real default model start
their own.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from services.client import MmgateClient
from services.models import build_tiny_model
from tests.support import RunningServer, start_server


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(build_tiny_model(tmp_path_factory.mktemp("models") / "tiny"))


@pytest.fixture(scope="session")
def server(tiny_model: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    running = start_server(
        tmp_path_factory.mktemp("logs"),
        tiny_model,
        MMGATE_MAX_CONCURRENT_REQUESTS="16",
        # the idle-connection test waits for it
        MMGATE_METRICS__READ_TIMEOUT_SECONDS="2",
        # the shutdown test, last, drains a long stream on it
        MMGATE_SHUTDOWN_GRACE_SECONDS="60",
    )
    yield running
    # the shutdown test has stopped it (exit code 0) unless it did not run
    assert running.stop() == 0, running.log()


@pytest.fixture
async def client(server: RunningServer) -> AsyncIterator[MmgateClient]:
    async with server.client(timeout=60.0) as client:
        yield client
