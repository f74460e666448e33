"""`mmgate stats`: the table (a pure function of GetStatsResponse), and `--watch` on a server."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from services.cli.commands import _parser
from services.cli.stats_view import render_stats
from services.proto.mmgate.v1 import cache_pb2 as pb
from tests.support import ROOT, RunningServer


def busy_stats() -> pb.GetStatsResponse:
    return pb.GetStatsResponse(
        model="tiny-llava",
        media_mode="embeddings",
        actor=pb.ActorStats(
            hits=7,
            misses=5,
            coalesced=2,
            tier_hits=1,
            alive=True,
            loop_lag_seconds=0.0004,
            flights=1,
            waiters=3,
            oldest_flight_seconds=2.5,
            mailbox_depth=4,
            entries=12,
            bytes=3 * 1024 * 1024,
            evictions=3,
            evicted_bytes=4096,
            recursion_rejections=1,
            compute_timeouts=2,
            tier_errors=6,
            tier_breaker_open=True,
        ),
        engine=pb.EngineCacheStats(
            prefix_cache_queries=1234,
            prefix_cache_hits=567,
            requests=12,
            requests_with_cached_prefix=3,
            running=1,
            waiting=2,
            kv_cache_usage=0.25,
            aborted=1,
        ),
        media=pb.MediaStats(decodes=4, encodes=2, rejected=1, not_held=5, encode_batches=1),
        engine_health=pb.EngineHealth(
            state="stalled", in_flight=3, seconds_since_step=21.5, stalls=1
        ),
    )


def row(text: str, name: str) -> list[str]:
    """The cells of the line that starts with ``name`` (after its indent)."""
    for line in text.splitlines():
        if line.strip().startswith(name):
            return line.strip()[len(name) :].split()
    raise AssertionError(f"no {name!r} line in:\n{text}")


def test_the_table_shows_the_three_levels() -> None:
    text = render_stats(busy_stats())
    assert row(text, "page") == [
        "1,234",
        "tokens",
        "567",
        "tokens",
        "45.9%",
        *row(text, "page")[5:],
    ]
    assert row(text, "prefix")[:5] == ["12", "requests", "3", "requests", "25.0%"]
    # the actor's totals over every stage: hits and joins of 14 lookups
    assert row(text, "actor")[:5] == ["14", "lookups", "9", "lookups", "64.3%"]
    assert "hit 7, coalesced 2, miss 5 (1 from the second tier)" in text
    assert row(text, "media mode") == ["embeddings"]
    assert row(text, "images decoded, encoded") == ["4,", "2"]
    assert row(text, "encoder runs (batches)") == ["1"]
    assert row(text, "refused, not held") == ["1,", "5"]


def test_the_table_shows_the_actors_health_and_the_engine() -> None:
    text = render_stats(busy_stats())
    assert row(text, "alive") == ["yes"]
    assert row(text, "loop lag") == ["0.4", "ms"]
    assert row(text, "flights, waiters") == ["1,", "3"]
    assert row(text, "oldest flight") == ["2.5", "s"]
    assert row(text, "mailbox depth") == ["4"]
    assert row(text, "entries, bytes") == ["12,", "3.0", "MiB"]
    assert row(text, "evictions") == ["3", "(4.0", "KiB)"]
    assert row(text, "recursion rejections") == ["1"]
    assert row(text, "compute timeouts") == ["2"]
    assert "breaker OPEN, 6 read errors" in text
    assert row(text, "state") == ["stalled,", "no", "step", "for", "21.5", "s"]
    assert row(text, "in flight, stalls") == ["3,", "1"]
    assert row(text, "running, waiting") == ["1,", "2"]
    assert row(text, "KV cache usage") == ["25.0%"]
    assert row(text, "aborted") == ["1"]


def test_an_idle_server_has_no_ratio_and_a_dead_actor_says_so() -> None:
    text = render_stats(pb.GetStatsResponse(actor=pb.ActorStats()))
    # nothing looked up yet is not a cache that never hits
    for level in ("page", "prefix", "actor"):
        assert row(text, level)[4] == "-", text
    assert row(text, "alive") == ["NO"]
    assert "breaker closed" in text
    assert text.endswith("\n")


def test_clips_show_only_where_a_model_took_any() -> None:
    assert "clips decoded" not in render_stats(busy_stats())
    stats = busy_stats()
    stats.video.CopyFrom(pb.VideoStats(decodes=3, frames=96, rejected=2, not_held=1))
    text = render_stats(stats)
    assert row(text, "clips decoded (frames)") == ["3", "(96)"]
    assert row(text, "clips refused, not held") == ["2,", "1"]


def test_a_tenant_sees_its_own_figures_and_no_others() -> None:
    own = pb.TenantStats(
        tenant="team-a",
        hits=3,
        misses=1,
        entries=2,
        bytes=2048,
        budget_bytes=4096,
        active_requests=1,
        max_concurrent_requests=8,
    )
    text = render_stats(pb.GetStatsResponse(tenant="team-a", tenants=[own]))
    assert row(text, "tenant") == ["team-a"]
    assert row(text, "team-a") == ["4", "75.0%", "2", "2.0", "KiB", "50.0%", "1", "of", "8"]
    assert "an admin's" in text
    assert "alive" not in text  # the actor's health is all tenants': not shown


def test_watch_options() -> None:
    parse = _parser().parse_args
    assert parse(["stats"]).watch is None
    assert parse(["stats", "--watch"]).watch == 2.0
    assert parse(["stats", "--watch", "--count", "3"]).count == 3
    assert parse(["stats", "--watch", "0.5"]).watch == 0.5
    for bad in (["--watch", "0"], ["--watch", "-1"], ["--watch", "--count", "0"]):
        with pytest.raises(SystemExit):
            parse(["stats", *bad])


def mmgate_stats(server: RunningServer, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "services.cli", "stats", "--target", server.target, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_watch_prints_count_tables(server: RunningServer) -> None:
    done = mmgate_stats(server, "--watch", "0.2", "--count", "2", "--timeout", "30")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "\x1b[" not in out  # not a terminal: no screen clearing
    tables = out.split("\n\nmmgate stats ")
    assert len(tables) == 2, out
    assert out.startswith(f"mmgate stats {server.target}, every 0.2 s, ")
    for table in tables:
        assert "cache levels" in table
        assert row(table, "alive") == ["yes"]


def test_count_needs_watch(server: RunningServer) -> None:
    done = mmgate_stats(server, "--count", "2")
    assert done.returncode == 2
    assert "--count needs --watch" in done.stderr


def test_ctrl_c_ends_the_watch(server: RunningServer) -> None:
    child = subprocess.Popen(
        [sys.executable, "-m", "services.cli", "stats", "--target", server.target, "--watch", "60"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        for line in child.stdout:  # the first table's last line, then the 60 s interval
            if line.strip().startswith("aborted"):
                break
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=30)
    assert child.returncode == 0, err
    assert "Traceback" not in err
    assert "cache levels" not in out  # no second table
