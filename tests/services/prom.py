"""Reading /metrics in tests: scrape over HTTP, look samples up, lint with promtool."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families

from cache_actor import CacheStats, WatchStats
from services.config import Settings
from services.engine.worker import EngineWorker
from services.media_types import VideoStats
from services.observability.adapter_metrics import adapter_families
from services.observability.degraded_metrics import DegradedStats, degraded_families
from services.observability.load_metrics import Load, load_families
from services.observability.media_metrics import (
    FetchStats,
    fetch_families,
    media_families,
    video_families,
)
from services.observability.metric_families import (
    actor_families,
    admission_families,
    auth_families,
    cache_level_families,
    chaos_families,
    engine_families,
    engine_health_families,
    info_families,
    lookup_families,
    loop_task_families,
    thread_families,
    tier_families,
)
from services.observability.queue_metrics import QueueStats, queue_families
from services.pipeline.threads import ThreadPools
from services.types import AdapterStats, EngineHealth, EngineStats, MediaStats

PROMTOOL_FALLBACK = Path("/usr/bin/promtool")

# the names dashboards, alerts and recording rules (deploy/) are written against
DASHBOARD_NAMES = (
    "mmgate_cache_page_queried_tokens_total",
    "mmgate_cache_page_hit_tokens_total",
    "mmgate_cache_prefix_requests_total",
    "mmgate_cache_prefix_hit_requests_total",
    "mmgate_cache_media_lookups_total",
    "mmgate_cache_hit_ratio",
    "vllm_cache_hit_rate",
    "mmgate_actor_lookups_total",
    "mmgate_actor_lookup_duration_seconds",
    "mmgate_actor_entries",
    "mmgate_actor_bytes",
    "mmgate_actor_flights",
    "mmgate_actor_waiters",
    "mmgate_actor_mailbox_depth",
    "mmgate_actor_mailbox_capacity",
    "mmgate_actor_loop_lag_seconds",
    "mmgate_actor_oldest_flight_seconds",
    "mmgate_actor_alive",
    "mmgate_actor_tier_breaker_open",
    "mmgate_actor_evictions_total",
    "mmgate_actor_evicted_bytes_total",
    "mmgate_actor_recursion_rejections_total",
    "mmgate_actor_compute_timeouts_total",
    "mmgate_actor_tier_errors_total",
    "mmgate_cache_degraded",
    "mmgate_grpc_requests_total",
    "mmgate_grpc_request_duration_seconds",
    "mmgate_grpc_streams_in_flight",
    "mmgate_engine_running_requests",
    "mmgate_engine_waiting_requests",
    "mmgate_engine_kv_cache_usage_ratio",
    "mmgate_engine_ready",
    "mmgate_engine_time_to_first_token_seconds",
    "mmgate_engine_prompt_tokens_total",
    "mmgate_engine_generation_tokens_total",
    "mmgate_engine_generation_tokens_per_second",
    "mmgate_engine_state",
    "mmgate_event_loop_blocked",
    "mmgate_event_loop_blocks_total",
    "mmgate_engine_in_flight_requests",
    "mmgate_engine_seconds_since_step",
    "mmgate_stage_threads",
    "mmgate_stage_threads_busy",
    "mmgate_stage_threads_waiting",
    "mmgate_media_decodes_total",
    "mmgate_media_encodes_total",
    "mmgate_media_rejected_total",
    "mmgate_media_video_decodes_total",
    "mmgate_media_video_frames_total",
    "mmgate_media_video_rejected_total",
    "mmgate_chaos_enabled",
    "mmgate_event_loop_tasks",
    "mmgate_info",
)


@dataclass(frozen=True)
class Scrape:
    text: str
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float]
    types: dict[str, str]  # family name -> type

    def value(self, name: str, /, **labels: str) -> float:
        """A sample's value; 0 when the series does not exist (yet)."""
        return self.samples.get((name, frozenset(labels.items())), 0.0)

    def total(self, name: str, /, **labels: str) -> float:
        """The sum over every series of ``name`` whose labels include ``labels``."""
        wanted = set(labels.items())
        return sum(v for (n, ls), v in self.samples.items() if n == name and wanted <= ls)


def parse(text: str) -> Scrape:
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    types: dict[str, str] = {}
    for family in text_string_to_metric_families(text):
        types[family.name] = family.type
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return Scrape(text, samples, types)


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as response:
        body: bytes = response.read()
        return body.decode()


async def scrape(url: str) -> Scrape:
    # in a thread: an in-process server answers a scrape on this very event loop
    return parse(await asyncio.to_thread(_get, url))


async def scrape_until(url: str, ready: Callable[[Scrape], bool], timeout: float = 30.0) -> Scrape:
    """Scrape until ``ready`` holds (what the engine reports lands with its next step)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            current = await scrape(url)
        except ConnectionError:
            # a server starved of CPU closes a scrape it could not read in time: poll again
            if time.monotonic() > deadline:
                raise
        else:
            if ready(current) or time.monotonic() > deadline:
                return current
        await asyncio.sleep(0.1)


def promtool() -> str:
    found = shutil.which("promtool") or (
        str(PROMTOOL_FALLBACK) if PROMTOOL_FALLBACK.exists() else None
    )
    assert found is not None, (
        "promtool not found: `make promtool` installs it (Debian package `prometheus`)"
    )
    return found


def promtool_problems(text: str) -> str:
    """What `promtool check metrics` says of mmgate's series (vLLM's own are exempt)."""
    ours = "\n".join(line for line in text.splitlines() if "vllm:" not in line) + "\n"
    result = subprocess.run(
        [promtool(), "check", "metrics"],
        input=ours,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return "" if result.returncode == 0 else (result.stdout + result.stderr).strip() or "failed"


# a replica with nothing to do: the load report's figures
IDLE_LOAD = Load(
    unix_seconds=0.0,
    ready=False,
    requests_in_progress=0,
    request_headroom=1,
    engine_running=0,
    engine_waiting=0,
    kv_cache_usage=0.0,
    queue_waiting=0,
    priorities=(),
    media=(),
    cache=(),
    adapters_running=(),
    max_loras=0,
)


def service_families(
    *,
    cache: CacheStats,
    mailbox_capacity: int = 1,
    lookups: Mapping[tuple[str, str, str], int] | None = None,
    engine: EngineStats | None = None,
    health: EngineHealth | None = None,
    model: str = "m",
    media: MediaStats | None = None,
    media_mode: str = "pixels",
    max_concurrent_requests: int = 1,
    loop_tasks: int = 0,
    tier_refused: int = 0,
    chaos: Mapping[tuple[str, str], int] | None = None,
) -> list[Metric]:
    """Every family the service's parts export, from the figures given (idle ones otherwise):
    what a scrape of a server carries besides the interceptor's and hook's own metrics."""
    idle = EngineWorker(Settings().engine)
    lookups = lookups or {}
    engine = engine or idle.stats()
    health = health or EngineHealth("starting", in_flight=0, seconds_since_step=0.0, stalls=0)
    return [
        *cache_level_families(engine, lookups),
        *lookup_families(lookups),
        *actor_families(cache, mailbox_capacity),
        *degraded_families(DegradedStats(), WatchStats()),
        *tier_families(tier_refused),
        *engine_families(False, engine, idle.token_stats()),
        *adapter_families(AdapterStats()),
        *engine_health_families(health),
        *thread_families(ThreadPools(Settings().threads).stats()),
        *admission_families(0, max_concurrent_requests),
        *loop_task_families(loop_tasks),
        *chaos_families(chaos is not None, chaos or {}),
        *auth_families({}),
        *info_families(model, media_mode),
        *queue_families(QueueStats()),
        *media_families(media or MediaStats()),
        *video_families(VideoStats()),
        *fetch_families(FetchStats()),
        *load_families(IDLE_LOAD),
    ]
