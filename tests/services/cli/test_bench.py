"""``mmgate bench`` against a real server (the session's, on the tiny text model), as a user runs
it: the summary on stdout, the JSON and the PNG written, and the figures what the server did."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support import ROOT, RunningServer


def bench(server: RunningServer, tmp_path: Path, *options: str) -> tuple[str, dict[str, object]]:
    report = tmp_path / "run.json"
    done = subprocess.run(
        [sys.executable, "-m", "services.cli", "bench", "--target", server.target,
         "--json", str(report), *options],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout, json.loads(report.read_text())


def test_a_closed_loop_run_reports_and_plots(server: RunningServer, tmp_path: Path) -> None:
    plot = tmp_path / "run.png"
    # images to a text model: refused with FAILED_PRECONDITION, counted as such
    out, report = bench(
        server, tmp_path, "--requests", "40", "--concurrency", "4", "--max-tokens", "4",
        "--image-ratio", "0.25", "--burst-every", "20", "--burst-size", "4", "--seed", "3",
        "--plot", str(plot),
    )  # fmt: skip
    summary = report["summary"]
    assert isinstance(summary, dict)
    requests = report["requests"]
    assert isinstance(requests, list)
    assert summary["requests"] == len(requests) == 40
    codes = summary["codes"]
    images = sum(1 for r in requests if r["kind"] == "image")
    # with mmgate's reason beside the code
    assert codes == {"FAILED_PRECONDITION (MODEL_TAKES_NO_IMAGES)": images, "OK": 40 - images}
    assert 0 < images < 40
    assert summary["succeeded"] == 40 - images
    assert all(r["tokens"] == 4 for r in requests if r["code"] == "OK")
    lookups = summary["lookups"]
    assert isinstance(lookups, dict)
    assert lookups["prompt/miss/none"] >= 1
    # a burst of identical deterministic requests: one engine run, shared
    assert sum(v for k, v in lookups.items() if k.startswith("response/")) == 4
    assert summary["ttft_ms"]["p50"] is not None
    for line in ("throughput", "time to first token", "end to end", "FAILED_PRECONDITION"):
        assert line in out
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert plot.stat().st_size > 20_000  # two panels of points, not an empty figure


def test_an_open_loop_run_is_bounded_by_time(server: RunningServer, tmp_path: Path) -> None:
    _, report = bench(
        server, tmp_path, "--rate", "20", "--duration", "2", "--max-tokens", "2", "--no-progress"
    )
    summary = report["summary"]
    assert isinstance(summary, dict)
    # about 40 arrivals in 2 s at 20/s (a Poisson process: allow for its spread)
    assert 15 <= summary["requests"] + summary["dropped"] <= 80
    assert summary["codes"] == {"OK": summary["requests"]}


def test_bench_needs_a_bound(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "services.cli", "bench"],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert "--requests, --duration" in done.stderr
