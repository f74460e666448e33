"""Inference.GetServerInfo, GetLoad and WatchLoad: which replica this is, and its load now.

    LoadReport.figures(): admission (calls in progress, headroom), the engine (running, waiting,
    KV cache, adapters running), mmgate's queue (by priority), the media pools, the memory cache
    by stage ─▶ one Load (observability/load_metrics.py), read between two turns of the event
    loop from what each part keeps: no engine call, no message to the cache actor

A router polls GetLoad (every 100 ms costs the replica little: docs/benchmarks.md) or streams
WatchLoad; a gateway's endpoint picker scrapes the same figures as ``mmgate_load_*``.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncGenerator, Iterator
from typing import final

import grpc
from prometheus_client.core import Metric

from ..config import Settings
from ..engine.protocol import ServedEngine
from ..errors import InvalidRequest, Violation
from ..observability.load_metrics import Load, load_families
from ..observability.metric_families import VERSION
from ..pipeline.cache_front import CacheFront
from ..pipeline.generation import PipelineRef
from ..pipeline.threads import ThreadPools
from ..proto.mmgate.v1 import inference_pb2 as pb
from ..wire import OVERLOADED
from .admission import Admission
from .auth import Caller
from .status import ServiceError
from .streams import StreamSlots

__all__ = ["LoadReport", "load_message", "watch_idle"]

# WatchLoad's interval bounds and default, milliseconds
MIN_INTERVAL_MS = 100
MAX_INTERVAL_MS = 60_000
DEFAULT_INTERVAL_MS = 1000


@final
class LoadReport:
    """What one replica reports of itself to routers."""

    def __init__(
        self,
        settings: Settings,
        admission: Admission,
        engine: ServedEngine,
        pipelines: PipelineRef,
        threads: ThreadPools,
        cache: CacheFront,
    ) -> None:
        self.settings = settings
        self.admission = admission
        self.engine = engine
        self.pipelines = pipelines
        self.threads = threads
        self.cache = cache
        self.replica = settings.replica or socket.gethostname()
        self._watchers = StreamSlots("WatchLoad streams", settings.load.max_watchers_per_tenant)

    @property
    def watchers(self) -> int:
        """WatchLoad streams open."""
        return self._watchers.open

    def server_info(self) -> pb.ServerInfo:
        info = pb.ServerInfo(
            version=VERSION,
            replica=self.replica,
            max_concurrent_requests=self.admission.limit,
            edges=self.settings.edges,
        )
        pipeline = self.pipelines.current
        if pipeline is not None:  # the engine has started
            info.model = self.engine.model_name
            info.max_model_len = self.engine.max_model_len
            info.media_mode = pipeline.media.mode
            info.video_mode = pipeline.media.videos.mode
            info.engine_slots = pipeline.queue.slots or 0
        return info

    def figures(self) -> Load:
        pipeline = self.pipelines.current
        engine = self.engine.stats()
        adapters = self.engine.adapter_stats()
        priorities = pipeline.queue.by_priority() if pipeline is not None else ()
        limit, active = self.admission.limit, self.admission.active
        return Load(
            unix_seconds=time.time(),
            ready=self.engine.ready,
            requests_in_progress=active,
            request_headroom=max(limit - active, 0),
            engine_running=engine.running,
            engine_waiting=engine.waiting,
            kv_cache_usage=engine.kv_cache_usage,
            queue_waiting=sum(waiting for _, _, waiting in priorities),
            priorities=priorities,
            media=self.threads.stats(),
            cache=self.cache.held_by_stage(),
            adapters_running=adapters.running,
            max_loras=adapters.max_loras,
        )

    def collect(self) -> Iterator[Metric]:
        return load_families(self.figures())

    def message(self, caller: Caller) -> pb.Load:
        """The load now, as ``caller`` may read it: the LoRA adapters running are those it may
        use (an admin: all), GetModelInfo's rule for adapter names."""
        message = load_message(self.figures())
        if not caller.admin:
            running = [name for name in message.adapters_running if caller.may_use(name)]
            del message.adapters_running[:]
            message.adapters_running.extend(running)
        return message

    async def watch(self, caller: Caller, interval_ms: int) -> AsyncGenerator[pb.Load, None]:
        """A load every ``interval_ms`` (0: the default) until closed; the first at once.

        Raises (at the first):
            InvalidRequest: an interval out of bounds.
            ServiceError: RESOURCE_EXHAUSTED: ``load.max_watchers`` streams open already, or
                the caller's tenant's ``load.max_watchers_per_tenant`` (TENANT_OVERLOADED).
        """
        interval_ms = interval_ms or DEFAULT_INTERVAL_MS
        if not MIN_INTERVAL_MS <= interval_ms <= MAX_INTERVAL_MS:
            bounds = f"{MIN_INTERVAL_MS} to {MAX_INTERVAL_MS}"
            raise InvalidRequest([Violation("interval_ms", f"{interval_ms}: must be {bounds}")])
        most = self.settings.load.max_watchers
        if self.watchers >= most:
            raise ServiceError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"{most} WatchLoad streams are open, the most this replica serves;"
                " poll GetLoad instead",
                reason=OVERLOADED,
            )
        release = self._watchers.take(caller.tenant)
        try:
            while True:
                yield self.message(caller)
                await asyncio.sleep(interval_ms / 1000)
        finally:
            release()


def watch_idle(seconds: float) -> ServiceError:
    """How a WatchLoad stream whose client read nothing for ``seconds`` ends."""
    return ServiceError(
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        f"this WatchLoad stream read nothing for {seconds:g} s while a load waited for it: its"
        " stream ends; watch again, or poll GetLoad",
    )


def load_message(load: Load) -> pb.Load:
    return pb.Load(
        unix_seconds=load.unix_seconds,
        ready=load.ready,
        requests_in_progress=load.requests_in_progress,
        request_headroom=load.request_headroom,
        engine_running=load.engine_running,
        engine_waiting=load.engine_waiting,
        kv_cache_usage=load.kv_cache_usage,
        queue_waiting=load.queue_waiting,
        priorities=[
            pb.PriorityLoad(priority=p, slots_running=held, waiting=waiting)
            for p, held, waiting in load.priorities
        ],
        media=[
            pb.PoolLoad(pool=s.pool, threads=s.threads, busy=s.busy, waiting=s.waiting)
            for s in load.media
        ],
        cache=[pb.StageLoad(stage=s, entries=n, bytes=b) for s, n, b in load.cache],
        cache_bytes=load.cache_bytes,
        adapters_running=load.adapters_running,
    )
