"""The whole run: how many vLLM engines it started, printed at the end (most of `make test`'s
time is engines starting; the count is what sharing servers between tests cuts), the servers
tests in more than one package share, and the order that lets a test end a shared server."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from services.engine.worker import EngineWorker
from services.models import build_tiny_llava
from tests.redis_support import RedisProcess, redis_server
from tests.replicas import Replicas
from tests.support import ENGINE_STARTS


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


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests marked ``ends_server`` run after every other test of the session."""
    items.sort(key=lambda item: item.get_closest_marker("ends_server") is not None)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if ENGINE_STARTS:
        parts = ", ".join(f"{count} {where}" for where, count in sorted(ENGINE_STARTS.items()))
        terminalreporter.write_line(f"engine starts: {sum(ENGINE_STARTS.values())} ({parts})")
