"""The repeated-images benchmark's bookkeeping: what its clock counts, how it judges that runs
agree, and where it pins the engine."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import psutil
import pytest

from bench import image_repeats
from bench.image_repeats import Case, Freezer, from_median, run_case, schedule


class CountingSide:
    """A side that answers at once and notes how many images existed when it was asked."""

    def __init__(
        self, images: dict[int, bytes], name: str = "counting", log: list[Any] | None = None
    ) -> None:
        self.name = name
        self.images = images
        self.made_when_asked: list[int] = []
        self.log: list[tuple[str, int, Any]] = [] if log is None else log
        self.states: Callable[[], Any] = lambda: None

    async def start(self) -> float:
        return 0.0

    async def ask(self, image: bytes, layout: str, n: int) -> tuple[float, int]:
        if n >= 0 and n < 1000:  # a measured request (not the working set, not a burst)
            self.made_when_asked.append(len(self.images))
        self.log.append((self.name, n, self.states()))
        return 0.001, len(image)

    async def counts(self) -> dict[str, float]:
        return {}

    async def close(self) -> None:
        pass


async def test_every_image_of_a_case_is_made_before_its_clock_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a JPEG takes ~10 ms to make: made inside the measured loop, it was counted in the first
    # side's requests/s (in each first run, where the images were new)
    monkeypatch.setattr(image_repeats, "photo", lambda seed, size: b"jpeg %d" % seed)
    images: dict[int, bytes] = {}
    side = CountingSide(images)
    case = Case("shared", 4, 0.5)
    await run_case([side], case, 20, 1_000, images)
    measured_images = 4 + 10  # the working set, then one new image a request not repeated
    assert side.made_when_asked
    assert min(side.made_when_asked) >= measured_images


def test_blocks_go_to_every_side_in_abba_order() -> None:
    assert schedule(5, 2, 2) == [
        (0, range(0, 2)),
        (1, range(0, 2)),
        (1, range(2, 4)),
        (0, range(2, 4)),
        (0, range(4, 5)),
        (1, range(4, 5)),
    ]
    # three sides: each block's order reversed, so each side's mean place is the middle
    places = [side for side, _ in schedule(40, 3, 10)]
    assert places == [0, 1, 2, 2, 1, 0] * 2
    assert [side for side, _ in schedule(3, 1, 40)] == [0]


class Server:
    """A stand-in for a server process with one child, its "engine"."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(["sh", "-c", "sleep 60 & wait"])
        self.pid = self.process.pid

    def engine(self) -> psutil.Process:
        for _ in range(1000):  # the shell forks its child at once
            children = psutil.Process(self.pid).children()
            if children:
                return children[0]
        raise AssertionError("no child")

    def close(self) -> None:
        for process in [*psutil.Process(self.pid).children(), psutil.Process(self.pid)]:
            process.kill()
        self.process.wait()


async def test_interleaved_sides_get_the_same_requests_and_only_the_one_asked_runs_its_engine(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(image_repeats, "photo", lambda seed, size: b"jpeg %d" % seed)
    images: dict[int, bytes] = {}
    log: list[tuple[str, int, Any]] = []
    a, b = CountingSide(images, "a", log), CountingSide(images, "b", log)
    servers = [Server(), Server()]
    try:
        engines = [server.engine() for server in servers]
        a.server, b.server = servers  # type: ignore[attr-defined]
        # each side notes, when asked, whether its engine and the other's are stopped
        a.states = b.states = lambda: tuple(e.status() == psutil.STATUS_STOPPED for e in engines)
        freezer = Freezer()
        freezer.add(a)
        freezer.add(b)
        out = await run_case([a, b], Case("shared", 2, 0.5), 6, 1_000, images, 3, freezer)
        freezer.thaw()
        assert psutil.STATUS_STOPPED not in [e.status() for e in engines]
    finally:
        for server in servers:
            server.close()
    measured = [(name, n) for name, n, _ in log if 0 <= n < 1000]
    assert measured == [("a", n) for n in (0, 1, 2)] + [("b", n) for n in (0, 1, 2, 3, 4, 5)] + [
        ("a", n) for n in (3, 4, 5)
    ]
    assert len(out["a"][0].ttft) == len(out["b"][0].ttft) == 6
    for name, _, stopped in log:  # every request: working sets, measured, bursts
        assert stopped == ((False, True) if name == "a" else (True, False))


def test_runs_agree_by_their_distance_from_the_median() -> None:
    assert from_median([1.0, 1.05, 0.95]) == pytest.approx(0.05)
    assert from_median([1.0, 1.0, 1.3]) == pytest.approx(0.3)
    # one run far off is found whichever side it is on
    assert from_median([2.0, 1.0, 1.0]) == pytest.approx(1.0)
    assert from_median([0.5, 1.0, 1.0]) == pytest.approx(0.5)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="pinning needs two CPUs")
def test_pin_leaves_the_engine_its_cpu_and_the_rest_to_everything_else() -> None:
    # in a child: pinning moves the process that calls it
    code = (
        "import os; from bench.image_repeats import pin; pin(0); "
        "print(sorted(os.sched_getaffinity(0)), os.environ['VLLM_CPU_OMP_THREADS_BIND'])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    others = sorted(os.sched_getaffinity(0) - {0})
    assert out.splitlines()[-1] == f"{others} 0"


def test_pin_on_a_single_cpu_changes_nothing() -> None:
    code = (
        "import os; os.sched_setaffinity(0, {0}); from bench.image_repeats import pin; pin(0); "
        "print(sorted(os.sched_getaffinity(0)), 'VLLM_CPU_OMP_THREADS_BIND' in os.environ)"
    )
    env = {k: v for k, v in os.environ.items() if k != "VLLM_CPU_OMP_THREADS_BIND"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    ).stdout
    assert out.splitlines()[-1] == "[0] False"
