"""deploy/: the Prometheus rules pass promtool's check and unit tests, and the Grafana dashboard
reads only metrics mmgate exports or the recording rules define (a typo shows an empty panel, not
an error, so nothing else would catch it).

promtool comes from Debian's `prometheus` package (`make promtool`); without it these tests fail.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.services.prom import DASHBOARD_NAMES

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS = ROOT / "deploy" / "prometheus"
RULE_FILES = sorted(PROMETHEUS.glob("*_rules.yml"))
DASHBOARD = ROOT / "deploy" / "grafana" / "mmgate.json"

# What mmgate exports, as Prometheus names them: the same list tests/services/test_metrics.py
# finds on a live server's /metrics, so a name here is one a real scrape has
EXPORTED = frozenset(DASHBOARD_NAMES) | {
    f"{name}{suffix}" for name in DASHBOARD_NAMES for suffix in ("_bucket", "_sum", "_count")
}
ALERTS = {
    "MmgateCacheHitRatioLow",
    "MmgateActorLoopLagHigh",
    "MmgateFlightStalled",
    "MmgateMailboxSaturated",
    "MmgateEngineNotReady",
    "MmgateActorDead",
    "MmgateCacheDegraded",
    "MmgateRecursionRejections",
    "MmgateEngineStalled",
    "MmgateEventLoopBlocked",
    "MmgateStageThreadsSaturated",
}
PROMQL_KEYWORDS = {
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "group_left",
    "group_right",
    "inf",
    "nan",
}


@pytest.fixture(scope="module")
def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail(
            "promtool not found: `make promtool` installs it (Debian's `prometheus` package)",
            pytrace=False,
        )
    return path


def run_promtool(promtool: str, *args: str) -> str:
    done = subprocess.run(
        [promtool, *args], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"promtool {' '.join(args)} failed:\n{output}"
    return output


def recorded_names() -> set[str]:
    text = (PROMETHEUS / "recording_rules.yml").read_text()
    return set(re.findall(r"^\s*- record:\s*(\S+)\s*$", text, re.MULTILINE))


def metric_names(expr: str) -> set[str]:
    """The series names a PromQL expression selects (not its functions, labels or keywords)."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    expr = re.sub(r"\{[^}]*\}", "", expr)
    expr = re.sub(r"\[[^\]]*\]", "", expr)
    expr = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", expr):
        if re.match(r"\s*\(", expr[match.end() :]) or match.group() in PROMQL_KEYWORDS:
            continue  # a function or an aggregation
        names.add(match.group())
    return names


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    for panel in dashboard["panels"]:
        found.append(panel)
        found.extend(panel.get("panels", []))  # a collapsed row holds its panels
    return found


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def test_rules_pass_promtool_check(promtool: str) -> None:
    assert len(RULE_FILES) == 2
    output = run_promtool(promtool, "check", "rules", *map(str, RULE_FILES))
    assert "FAILED" not in output


def test_rules_pass_their_unit_tests(promtool: str) -> None:
    output = run_promtool(promtool, "test", "rules", str(PROMETHEUS / "rules_test.yml"))
    assert "SUCCESS" in output


def test_every_alert_is_defined_and_unit_tested() -> None:
    defined = set(re.findall(r"- alert:\s*(\S+)", (PROMETHEUS / "alert_rules.yml").read_text()))
    tested = set(re.findall(r"alertname:\s*(\S+)", (PROMETHEUS / "rules_test.yml").read_text()))
    assert defined == ALERTS
    assert tested == ALERTS


def test_rules_and_their_tests_name_only_exported_or_recorded_series() -> None:
    known = EXPORTED | recorded_names()
    for path in [*RULE_FILES, PROMETHEUS / "rules_test.yml"]:
        named = set(re.findall(r"\b(?:mmgate|vllm)[_:][A-Za-z0-9_:]*", path.read_text()))
        assert named - known == set(), path.name


def test_metric_names_parser() -> None:
    expr = (
        'histogram_quantile(0.95, sum by (stage, le) (rate(mmgate_x_bucket{a=~"b|c"}'
        "[$__rate_interval]))) / on (job) group_left mmgate:y:rate5m or vector(0)"
    )
    assert metric_names(expr) == {"mmgate_x_bucket", "mmgate:y:rate5m"}
    assert metric_names("sum(mmgate_cache_pge_hit_tokens_total)") == {
        "mmgate_cache_pge_hit_tokens_total"
    }


def test_dashboard_shape(dashboard: dict[str, Any]) -> None:
    assert dashboard["uid"] == "mmgate"
    assert dashboard["schemaVersion"] >= 36
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert variables["instance"]["type"] == "query"
    ids = [panel["id"] for panel in panels(dashboard)]
    assert len(ids) == len(set(ids))
    occupied: set[tuple[int, int]] = set()
    for panel in panels(dashboard):
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        cells = {
            (x, y)
            for x in range(grid["x"], grid["x"] + grid["w"])
            for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not cells & occupied, f"{panel['title']!r} overlaps another panel"
        occupied |= cells


def test_dashboard_queries_name_only_exported_or_recorded_series(
    dashboard: dict[str, Any],
) -> None:
    known = EXPORTED | recorded_names()
    queried: set[str] = set()
    for panel in panels(dashboard):
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            expr = target["expr"]
            assert 'instance=~"$instance"' in expr, f"{panel['title']!r}: {expr}"
            names = metric_names(expr)
            assert names, f"{panel['title']!r}: {expr}"
            assert names <= known, f"{panel['title']!r} queries unknown {names - known}"
            queried |= names
    # the panels an operator needs: hit ratio per level, lookups by outcome, actor health, TTFT,
    # tokens, gRPC
    assert {
        "mmgate:cache_hit_ratio:rate5m",
        "mmgate:cache_media_lookups:rate5m",
        "mmgate_actor_lookups_total",
        "mmgate_actor_loop_lag_seconds",
        "mmgate_actor_oldest_flight_seconds",
        "mmgate_actor_mailbox_depth",
        "mmgate_actor_mailbox_capacity",
        "mmgate_actor_flights",
        "mmgate_actor_waiters",
        "mmgate_actor_alive",
        "mmgate_actor_recursion_rejections_total",
        "mmgate:engine_ttft_seconds:p50_rate5m",
        "mmgate:engine_ttft_seconds:p95_rate5m",
        "mmgate:engine_generation_tokens:rate5m",
        "mmgate:grpc_requests:rate5m",
        "mmgate:grpc_error_ratio:rate5m",
        "mmgate_engine_running_requests",
        "mmgate_engine_waiting_requests",
        "mmgate_engine_kv_cache_usage_ratio",
    } <= queried
