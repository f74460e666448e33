"""The reliability suites: real servers on the tiny LLaVA (real vLLM, real gRPC, pixels and
text; embeddings for chaos and stalls), driven by ``mmgate bench``'s own load loops. The short
form runs in ``make test``; ``MMGATE_SOAK=1`` (``make soak``) runs the long one. Each suite
writes what happened to ``build/reliability/<suite>.json``, from which ``python -m
tests.reliability.report`` writes docs/reliability.md."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.redis_support import RedisProcess, redis_server
from tests.support import LLAVA_GRACE_SECONDS as GRACE_SECONDS
from tests.support import ROOT, RunningServer, engine_core, start_server

SOAK = os.environ.get("MMGATE_SOAK") == "1"
RESULTS = ROOT / "build" / "reliability"


def scaled(short: int, soak: int) -> int:
    return soak if SOAK else short


def record(suite: str, result: dict[str, object]) -> None:
    """What a suite measured, for docs/reliability.md."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    result = {"suite": suite, "form": "soak" if SOAK else "short", **result}
    (RESULTS / f"{suite}.json").write_text(json.dumps(result, indent=2) + "\n")


StallResults = dict[str, dict[str, Any]]


@pytest.fixture(scope="session")
def stall_results() -> Iterator[StallResults]:
    """The stalls suite's figures, by stall: build/reliability/stalls.json at the end (its last
    test runs after every other suite's, so the figures outlive the module)."""
    figures: StallResults = {}
    yield figures
    if figures:
        record("stalls", {"stalls": figures})


# the chaos server's tenants: each its own fault plan; every other tenant gets none
CHAOS_TENANT = "chaos"
STALL_TENANT = "stall-decode"  # every image decode stalls
BLOCK_TENANT = "block-loop"  # every request blocks the event loop for BLOCK_SECONDS
FAULTS = {"fail": 0.1, "stall": 0.04, "slow": 0.1}
CHAOS_PLANS = {
    CHAOS_TENANT: {"decode": FAULTS, "encode": FAULTS, "engine": FAULTS},
    STALL_TENANT: {"decode": {"stall": 1.0}},
    BLOCK_TENANT: {"loop_block": 1.0},
}
BLOCK_SECONDS = 1.5
# the watchdogs' thresholds on the chaos server, short enough to measure in a test
ENGINE_STALL_SECONDS = 1.0
ENGINE_HUNG_SECONDS = 6.0
LOOP_BLOCK_SECONDS = 0.5
LOOP_RECOVER_SECONDS = 1.0
FLIGHT_STALL_SECONDS = 1.0
COMPUTE_DEADLINE_SECONDS = 4.0
HEALTH_INTERVAL_SECONDS = 0.2
# the cache actor killed, then stalled, once each, early in the chaos suite's load (after its
# reference run of the same number of requests; the kill before Redis is, so that the fresh
# actor meets the dead Redis too): degraded mode under load
CHAOS_REQUESTS = scaled(800, 10000)
ACTOR_KILL_AFTER = CHAOS_REQUESTS + 20
ACTOR_STALL_AFTER = CHAOS_REQUESTS + 150
ACTOR_STALL_SECONDS = 1.5


@pytest.fixture(scope="session")
def chaos_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisProcess]:
    """The chaos server's second tier: the chaos suite kills it and starts it again."""
    server = redis_server(tmp_path_factory.mktemp("chaos-redis"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def chaos_server(
    tmp_path_factory: pytest.TempPathFactory, tiny_llava: Path, chaos_redis: RedisProcess
) -> Iterator[RunningServer]:
    """The chaos and stalls suites' server: faults for the tenants above, short watchdogs,
    embeddings mode (mmgate decodes and encodes), a Redis second tier; the stalls suite, last,
    kills its engine."""
    running = start_server(
        tmp_path_factory.mktemp("chaos"),
        str(tiny_llava),
        MMGATE_ENGINE__DTYPE="float32",
        MMGATE_MEDIA__MODE="embeddings",
        MMGATE_CHAOS__ENABLED="true",
        MMGATE_CHAOS__SEED="11",
        MMGATE_CHAOS__SLOW_SECONDS="0.2",
        MMGATE_CHAOS__BLOCK_SECONDS=str(BLOCK_SECONDS),
        MMGATE_CHAOS__TENANTS=json.dumps(CHAOS_PLANS),
        MMGATE_HEALTH__INTERVAL_SECONDS=str(HEALTH_INTERVAL_SECONDS),
        MMGATE_HEALTH__ENGINE_STALL_SECONDS=str(ENGINE_STALL_SECONDS),
        MMGATE_HEALTH__ENGINE_HUNG_SECONDS=str(ENGINE_HUNG_SECONDS),
        MMGATE_HEALTH__LOOP_BLOCK_SECONDS=str(LOOP_BLOCK_SECONDS),
        MMGATE_HEALTH__LOOP_RECOVER_SECONDS=str(LOOP_RECOVER_SECONDS),
        MMGATE_CACHE__STALL_THRESHOLD=str(FLIGHT_STALL_SECONDS),
        MMGATE_CACHE__COMPUTE_DEADLINE=str(COMPUTE_DEADLINE_SECONDS),
        MMGATE_REDIS__URL=chaos_redis.url,
        MMGATE_REDIS__BREAKER_SECONDS="1",
        MMGATE_CHAOS__ACTOR_STALL_AFTER=str(ACTOR_STALL_AFTER),
        MMGATE_CHAOS__ACTOR_STALL_SECONDS=str(ACTOR_STALL_SECONDS),
        MMGATE_CHAOS__ACTOR_KILL_AFTER=str(ACTOR_KILL_AFTER),
    )
    yield running
    core = engine_core(running)
    if core is not None:  # never leave a stopped process behind
        os.kill(core.pid, signal.SIGCONT)
    running.stop()  # after the engine's death the exit code is not the point here


__all__ = ["GRACE_SECONDS", "RESULTS", "SOAK", "Path", "record", "scaled"]
