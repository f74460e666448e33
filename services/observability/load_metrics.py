"""A replica's load, as Inference.GetLoad reports it and as routers scrape it.

    LoadReport (api/load.py) ─ figures() ─▶ Load: one moment's figures, read on the event loop
        ├─▶ GetLoad / WatchLoad: the message
        └─▶ load_families: ``mmgate_load_*``, the names an inference gateway's endpoint picker
            is configured with (deploy/k8s/inference-pool); stable, as every published name is

The figures by priority are in the message only: priorities are a tenant's to choose within its
range, so as a label their number would have no bound.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import final

from prometheus_client.core import GaugeMetricFamily, Metric

from ..types import ThreadPoolStats

__all__ = ["Load", "load_families"]


@final
@dataclass(frozen=True, slots=True)
class Load:
    unix_seconds: float
    ready: bool
    requests_in_progress: int
    request_headroom: int
    engine_running: int
    engine_waiting: int
    kv_cache_usage: float
    queue_waiting: int
    # (priority, engine slots held, runs waiting in mmgate's queue), most urgent first
    priorities: tuple[tuple[int, int, int], ...]
    media: tuple[ThreadPoolStats, ...]
    # (stage, entries, bytes) held in memory
    cache: tuple[tuple[str, int, int], ...]
    adapters_running: tuple[str, ...]
    max_loras: int

    @property
    def waiting(self) -> int:
        """Requests waiting for the engine: in mmgate's queue, and held by it unscheduled."""
        return self.queue_waiting + self.engine_waiting

    @property
    def cache_bytes(self) -> int:
        return sum(held for _, _, held in self.cache)


def load_families(load: Load) -> Iterator[Metric]:
    yield GaugeMetricFamily(
        "mmgate_load_waiting_requests",
        "Requests waiting for the engine: in mmgate's queue and held by the engine unscheduled.",
        value=load.waiting,
    )
    yield GaugeMetricFamily(
        "mmgate_load_running_requests",
        "Sequences the engine runs now.",
        value=load.engine_running,
    )
    yield GaugeMetricFamily(
        "mmgate_load_kv_cache_usage_ratio",
        "The engine's KV cache in use, 0 to 1.",
        value=load.kv_cache_usage,
    )
    yield GaugeMetricFamily(
        "mmgate_load_request_headroom",
        "Calls more the server admits now before refusing with RESOURCE_EXHAUSTED.",
        value=load.request_headroom,
    )
    info = GaugeMetricFamily(
        "mmgate_load_lora_adapters",
        "LoRA adapters with runs in the engine (value: when this was read, Unix seconds); the"
        " labels of vLLM's LoRA requests gauge, which endpoint pickers read.",
        labels=["running_lora_adapters", "waiting_lora_adapters", "max_lora"],
    )
    info.add_metric([",".join(load.adapters_running), "", str(load.max_loras)], load.unix_seconds)
    yield info
    entries = GaugeMetricFamily(
        "mmgate_load_cache_entries", "Entries held in memory, by stage.", labels=["stage"]
    )
    held = GaugeMetricFamily(
        "mmgate_load_cache_bytes", "Bytes held in memory, by stage.", labels=["stage"]
    )
    for stage, count, nbytes in load.cache:
        entries.add_metric([stage], count)
        held.add_metric([stage], nbytes)
    yield entries
    yield held
