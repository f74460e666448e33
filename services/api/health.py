"""Health: what the gRPC health services say, from the actor, the engine and the event loop.

    every interval (and at once when the heartbeat sees a block):
      actor ping ──────────────┐   mmgate.cache-actor: the actor answers (not degraded)
      engine: ready? failed? ──┼─▶ liveness:  the cache usable (on_failure "fail": the actor
                               │              answers; "compute": not dead past its
                               │              replacements), engine not failed, not hung
      engine progress ─────────┤   readiness: live, engine ready, not stalled, loop not
      loop heartbeat ──────────┘              blocked lately, not shutting down
                                   ─▶ "", each mmgate service, "readiness" follow readiness

The engine watchdog: requests open and no engine step for ``engine_stall_seconds`` is a stall
(readiness NOT_SERVING, a warning naming the oldest requests waiting, a count); for
``engine_hung_seconds`` the engine is hung, and liveness fails with it, as it does once the
engine has died, so the orchestrator restarts the pod. Readiness returns when steps resume.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from typing import final

from grpc_health.v1 import health_pb2
from grpc_health.v1._async import HealthServicer
from prometheus_client.core import Metric

from cache_actor import CacheActorDead

from ..config import HealthSettings
from ..engine.protocol import ServedEngine
from ..observability.heartbeat import LoopHeartbeat
from ..observability.metric_families import engine_health_families
from ..pipeline.cache_front import CacheFront
from ..types import EngineHealth, EngineState

log = logging.getLogger("mmgate.health")

LIVENESS = "liveness"
# the cache actor alone: NOT_SERVING while requests compute without it (degraded mode)
CACHE_ACTOR = "mmgate.cache-actor"
READINESS = "readiness"
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@final
class HealthMonitor:
    def __init__(
        self,
        settings: HealthSettings,
        servicer: HealthServicer,
        cache: CacheFront,
        engine: ServedEngine,
        readiness_services: tuple[str, ...],
    ) -> None:
        self.settings = settings
        self.servicer = servicer
        self.cache = cache
        self.engine = engine
        self.readiness_services = ("", *readiness_services, READINESS)
        self._wake = asyncio.Event()
        self.heartbeat = LoopHeartbeat(
            block_seconds=settings.loop_block_seconds, on_block=self._loop_was_blocked
        )
        self._blocked_tasks: set[asyncio.Task[None]] = set()
        self.stopping = False
        self.stalls = 0
        self._state: EngineState = "starting"
        self._task: asyncio.Task[None] | None = None

    async def starting(self) -> None:
        """The port is about to open: alive, not ready."""
        for service in self.readiness_services:
            await self.servicer.set(service, NOT_SERVING)
        await self.servicer.set(LIVENESS, SERVING)
        await self.servicer.set(CACHE_ACTOR, SERVING)

    def start(self) -> None:
        """Watch from now on (the engine has started)."""
        self.heartbeat.start()
        self._task = asyncio.create_task(self._watch(), name="mmgate-health")

    async def stop(self) -> None:
        """Shutting down: NOT_SERVING everywhere, for good."""
        self.stopping = True
        await self.servicer.enter_graceful_shutdown()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self.heartbeat.stop()

    def _loop_was_blocked(self) -> None:
        """First thing the loop runs once it moves again: readiness off before any probe is
        answered (this task's first step comes before the I/O that arrived meanwhile)."""
        task = asyncio.create_task(self._not_ready(), name="mmgate-health-blocked")
        self._blocked_tasks.add(task)
        task.add_done_callback(self._blocked_tasks.discard)
        self._wake.set()

    async def _not_ready(self) -> None:
        for service in self.readiness_services:
            await self.servicer.set(service, NOT_SERVING)

    def engine_health(self) -> EngineHealth:
        progress = self.engine.progress
        return EngineHealth(
            state=self._engine_state(),
            in_flight=progress.in_flight,
            seconds_since_step=progress.silence(time.monotonic()),
            stalls=self.stalls,
        )

    def collect(self) -> Iterator[Metric]:
        """The engine as the watchdog sees it (metrics.py)."""
        return engine_health_families(self.engine_health())

    def _engine_state(self) -> EngineState:
        engine = self.engine
        if engine.stopped:
            return "stopped"
        if engine.failed:
            return "failed"
        if not engine.ready:
            return "starting"
        silence = engine.progress.silence(time.monotonic())
        if silence >= self.settings.engine_hung_seconds:
            return "hung"
        if silence >= self.settings.engine_stall_seconds:
            return "stalled"
        return "serving"

    async def update(self) -> None:
        """One look at every part; sets every health service."""
        cache = self.cache
        try:
            await cache.ping(timeout=self.settings.interval_seconds)
            cache.found_answering()
        except CacheActorDead:
            cache.found_dead()  # replaced by a fresh actor while the policy and window allow
        except TimeoutError:
            cache.found_stalled()
        # "fail": the actor is part of the replica; "compute": requests go on without it, and
        # only a death beyond the replacements fails liveness
        cache_ok = not cache.exhausted
        if cache.on_failure == "fail":
            cache_ok = cache_ok and cache.degraded is None
        state = self._engine_state()
        self._note(state)
        loop_blocked = self.heartbeat.recent(self.settings.loop_recover_seconds)
        alive = cache_ok and state not in ("failed", "hung")
        ready = alive and state == "serving" and not loop_blocked and not self.stopping
        await self.servicer.set(LIVENESS, SERVING if alive else NOT_SERVING)
        await self.servicer.set(
            CACHE_ACTOR, SERVING if cache.degraded is None and not self.stopping else NOT_SERVING
        )
        for service in self.readiness_services:
            await self.servicer.set(service, SERVING if ready else NOT_SERVING)

    def _note(self, state: EngineState) -> None:
        """Log and count each change of the engine's state."""
        previous, self._state = self._state, state
        if state == previous:
            return
        progress = self.engine.progress
        if state == "stalled" or (state == "hung" and previous != "stalled"):
            self.stalls += 1
        if state in ("stalled", "hung"):
            now = time.monotonic()
            waiting = ", ".join(
                f"{r.request_id}"
                + (f" ({r.label!r})" if r.label else "")
                + f" open {now - r.opened:.1f} s"
                for r in progress.oldest()
            )
            log.warning(
                "engine %s: no engine step for %.1f s with %d requests in flight "
                "(at its last step: %d running, %d waiting); oldest: %s; %s",
                state,
                progress.silence(now),
                progress.in_flight,
                self.engine.stats().running,
                self.engine.stats().waiting,
                waiting,
                "liveness fails" if state == "hung" else "readiness NOT_SERVING",
            )
        elif state == "failed":
            log.error("the engine has failed: liveness fails, readiness NOT_SERVING")
        elif state == "serving" and previous in ("stalled", "hung"):
            log.warning("engine stepping again: readiness follows the rest")

    async def _watch(self) -> None:
        while not self.stopping:
            self._wake.clear()
            await self.update()
            try:
                async with asyncio.timeout(self.settings.interval_seconds):
                    await self._wake.wait()
            except TimeoutError:
                continue


__all__ = ["CACHE_ACTOR", "LIVENESS", "READINESS", "HealthMonitor"]
