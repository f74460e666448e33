"""The reliability suites: real servers on the tiny LLaVA (real vLLM, real gRPC, pixels and
text; embeddings for chaos and stalls), driven by ``mmgate bench``'s own load loops. The short
form runs in ``make test``; ``MMGATE_SOAK=1`` (``make soak``) runs the long one. Each suite
writes what happened to ``build/reliability/<suite>.json``, from which ``python -m
tests.reliability.report`` writes docs/reliability.md."""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from services.engine.adapter_files import CONFIG_FILE, WEIGHTS_FILE
from services.models.adapters import build_test_adapter
from tests.redis_support import RedisProcess, redis_server
from tests.services.image_hosts import Answer, ImageHost, image
from tests.services.imagegen import png
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


# the chaos server's LoRA adapters: more served than its engine has slots
CHAOS_ADAPTERS = ("l1", "l2", "l3")
CHAOS_LORA_SLOTS = 2


def chaos_adapter_root(tiny_llava: Path, root: Path, outside: Path) -> Path:
    """The adapters served, and two folders a load must refuse: one whose files link out of
    the root, one whose config is a FIFO (a read of it would wait for a writer forever)."""
    for seed, name in enumerate(CHAOS_ADAPTERS, start=1):
        build_test_adapter(tiny_llava, root / name, seed=seed)
    shutil.copytree(root / "l1", outside / "elsewhere")
    (root / "links-out").mkdir()
    for file in (CONFIG_FILE, WEIGHTS_FILE):
        (root / "links-out" / file).symlink_to(outside / "elsewhere" / file)
    shutil.copytree(root / "l1", root / "fifo-config")
    (root / "fifo-config" / CONFIG_FILE).unlink()
    os.mkfifo(root / "fifo-config" / CONFIG_FILE)
    return root


class ChaosImages:
    """The chaos server's image URLs: plain HTTP on 127.0.0.1 (the one address it may reach),
    an image at once, one that comes after its caller's deadline, and one that never ends; it
    counts the endless answers whose client hung up."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.hung_up = 0
        self.host = ImageHost(
            "127.0.0.1",
            None,
            {"/cat.png": image(png(4101)), "/late.png": self.late, "/drip.png": self.drip},
        )

    def url(self, path: str) -> str:
        return self.host.url(path, "127.0.0.1")

    def late(self) -> Answer:
        def body() -> Iterator[bytes]:
            self.stop.wait(LATE_IMAGE_SECONDS)  # past the deadline of every request for it
            yield png(4102)

        return 200, {"Content-Type": "image/png"}, cast(list[bytes], body())

    def drip(self) -> Answer:
        def chunks() -> Iterator[bytes]:
            try:
                yield b"\x89PNG\r\n\x1a\n"
                while not self.stop.wait(0.02):  # the drip's pace, not the test's sequence
                    yield b"\0" * 1024
            finally:  # the write failed: the fetcher closed the connection
                if not self.stop.is_set():
                    with self.lock:
                        self.hung_up += 1

        return 200, {"Content-Type": "image/png"}, cast(list[bytes], chunks())

    def close(self) -> None:
        self.stop.set()
        self.host.stop()


LATE_IMAGE_SECONDS = 10.0


@pytest.fixture(scope="session")
def chaos_images() -> Iterator[ChaosImages]:
    images = ChaosImages()
    yield images
    images.close()


@pytest.fixture(scope="session")
def chaos_server(
    tmp_path_factory: pytest.TempPathFactory,
    tiny_llava: Path,
    chaos_redis: RedisProcess,
    chaos_images: ChaosImages,
) -> Iterator[RunningServer]:
    """The chaos and stalls suites' server: faults for the tenants above, short watchdogs,
    embeddings mode (mmgate decodes and encodes), a Redis second tier, three LoRA adapters for
    two slots, image URLs from ``chaos_images``; the stalls suite, last, kills its engine."""
    adapters = chaos_adapter_root(
        tiny_llava, tmp_path_factory.mktemp("chaos-adapters"), tmp_path_factory.mktemp("outside")
    )
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
        MMGATE_ENGINE__ADAPTERS=json.dumps({name: str(adapters / name) for name in CHAOS_ADAPTERS}),
        MMGATE_ENGINE__ADAPTER_ROOT=str(adapters),
        MMGATE_ENGINE__MAX_LORAS=str(CHAOS_LORA_SLOTS),
        MMGATE_MEDIA__URL_SCHEMES='["http"]',
        MMGATE_MEDIA__URL_ALLOW='["127.0.0.1/32"]',
    )
    yield running
    core = engine_core(running)
    if core is not None:  # never leave a stopped process behind
        os.kill(core.pid, signal.SIGCONT)
    running.stop()  # after the engine's death the exit code is not the point here


__all__ = ["GRACE_SECONDS", "RESULTS", "SOAK", "Path", "record", "scaled"]
