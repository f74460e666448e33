"""The whole run: how many vLLM engines it started, printed at the end (most of `make test`'s
time is engines starting; the count is what sharing servers between tests cuts)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from services.engine.worker import EngineWorker
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


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if ENGINE_STARTS:
        parts = ", ".join(f"{count} {where}" for where, count in sorted(ENGINE_STARTS.items()))
        terminalreporter.write_line(f"engine starts: {sum(ENGINE_STARTS.values())} ({parts})")
