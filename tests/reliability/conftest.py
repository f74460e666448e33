"""The reliability suites: a real server on the tiny LLaVA (real vLLM, real gRPC, pixels and
text), driven by ``mmgate bench``'s own load loops. The short form runs in ``make test``;
``MMGATE_SOAK=1`` (``make soak``) runs the long one. Each suite writes what happened to
``build/reliability/<suite>.json``, from which ``python -m tests.reliability.report`` writes
docs/reliability.md."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.models import build_tiny_llava
from tests.support import ROOT, RunningServer, start_server

SOAK = os.environ.get("MMGATE_SOAK") == "1"
RESULTS = ROOT / "build" / "reliability"


def scaled(short: int, soak: int) -> int:
    return soak if SOAK else short


def record(suite: str, result: dict[str, object]) -> None:
    """What a suite measured, for docs/reliability.md."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    result = {"suite": suite, "form": "soak" if SOAK else "short", **result}
    (RESULTS / f"{suite}.json").write_text(json.dumps(result, indent=2) + "\n")


GRACE_SECONDS = 30


@pytest.fixture(scope="session")
def llava_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """One server for every suite; the drain suite, last, ends it with SIGTERM."""
    model = build_tiny_llava(tmp_path_factory.mktemp("models") / "tiny-llava")
    running = start_server(
        tmp_path_factory.mktemp("reliability"),
        str(model),
        MMGATE_ENGINE__MAX_MODEL_LEN="512",
        MMGATE_ENGINE__DTYPE="float32",
        MMGATE_MEDIA__MODE="pixels",
        MMGATE_SHUTDOWN_GRACE_SECONDS=str(GRACE_SECONDS),
    )
    yield running
    if running.process.poll() is None:  # the drain suite did not run (or failed before)
        assert running.stop() == 0, running.log()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests marked ``ends_server`` run after every other test of the session."""
    items.sort(key=lambda item: item.get_closest_marker("ends_server") is not None)


__all__ = ["GRACE_SECONDS", "RESULTS", "SOAK", "Path", "record", "scaled"]
