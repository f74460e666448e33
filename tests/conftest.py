"""The whole run: how many vLLM engines it started, printed at the end (most of `make test`'s
time is engines starting; the count is what sharing servers between tests cuts), the servers
tests in more than one package share, and the order that lets a test end a shared server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from services.engine.worker import EngineWorker
from services.models import build_tiny_llava, build_tiny_video
from tests.redis_support import RedisProcess, redis_server
from tests.replicas import Replicas
from tests.support import ENGINE_STARTS, LLAVA_GRACE_SECONDS, RunningServer, start_server


@pytest.fixture(scope="session", autouse=True)
def count_engine_starts() -> Iterator[None]:
    """Engines started in this process (an EngineWorker, an MmgateServer); the servers that
    tests.support.start_server spawns count themselves."""
    start = EngineWorker.start

    async def counted(self: EngineWorker, *args: Any, **kwargs: Any) -> None:
        ENGINE_STARTS["in this process"] += 1
        await start(self, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(EngineWorker, "start", counted)
        yield


@pytest.fixture(scope="session")
def replicas_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisProcess]:
    """The shared replicas' Redis; the storage tests pause it, kill it and start it again."""
    server = redis_server(tmp_path_factory.mktemp("replicas-redis"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def shared_replicas(
    tmp_path_factory: pytest.TempPathFactory, replicas_redis: RedisProcess
) -> Iterator[Replicas]:
    """Two replicas sharing ``replicas_redis``, for the storage tests and the proxy's smoke
    test; the proxy's fail-over test, last (``ends_server``), kills one of them."""
    model = build_tiny_llava(tmp_path_factory.mktemp("models") / "tiny-llava")
    group = Replicas(tmp_path_factory.mktemp("replicas"), model, replicas_redis.url)
    group.start_all(2)
    try:
        yield group
    finally:
        group.stop()


@pytest.fixture(scope="session")
def tiny_llava(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_llava(tmp_path_factory.mktemp("models") / "tiny-llava")


@pytest.fixture(scope="session")
def tiny_video(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_video(tmp_path_factory.mktemp("models") / "tiny-video")


@pytest.fixture(scope="session")
def llava_server(
    tmp_path_factory: pytest.TempPathFactory, tiny_llava: Path
) -> Iterator[RunningServer]:
    """The tiny LLaVA in pixels mode: the load, hostile-input and drain suites' server, and the
    client's image tests'; the drain suite, last (``ends_server``), ends it."""
    running = start_server(
        tmp_path_factory.mktemp("llava"),
        str(tiny_llava),
        MMGATE_ENGINE__MAX_MODEL_LEN="512",
        MMGATE_ENGINE__DTYPE="float32",
        MMGATE_MEDIA__MODE="pixels",
        MMGATE_SHUTDOWN_GRACE_SECONDS=str(LLAVA_GRACE_SECONDS),
        # caches small enough to fill, and evict, within the long load: memory that still grows
        # past them is a leak (with the defaults, 512 MiB and vLLM's 4 GiB processor cache fill
        # for hours and the long load's RSS rose 14-16%)
        MMGATE_CACHE__MAX_BYTES=str(32 * 2**20),
        MMGATE_ENGINE__EXTRA='{"mm_processor_cache_gb": 0.03}',
    )
    yield running
    if running.process.poll() is None:  # the drain suite did not run (or failed before)
        assert running.stop() == 0, running.log()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests marked ``ends_server`` run after every other test of the session."""
    items.sort(key=lambda item: item.get_closest_marker("ends_server") is not None)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if ENGINE_STARTS:
        parts = ", ".join(f"{count} {where}" for where, count in sorted(ENGINE_STARTS.items()))
        terminalreporter.write_line(f"engine starts: {sum(ENGINE_STARTS.values())} ({parts})")
