"""The session's in-process server: a real mmgate server in the test process on the tiny LLaVA
in embeddings mode (so a test can reach into its pipeline), tracing into memory and to a real
OTLP receiver, started while a client watched its health. The pipeline, tracing and health
tests share it (tests/services/conftest.py); the health tests that end it run last.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from services.api.health import LIVENESS, READINESS
from services.api.server import MmgateServer
from services.engine.worker import EngineWorker
from services.observability.spans import flush_pending

from .otlp_receiver import OtlpReceiver

TRACED_SERVICE = "mmgate-tracing-test"


def finished(exporter: InMemorySpanExporter) -> tuple[ReadableSpan, ...]:
    """The spans ended so far, the deferred ends included (spans.later)."""
    flush_pending()
    return exporter.get_finished_spans()


class SpanWatch(SpanProcessor):
    """Wakes the test when a span ends (in any thread)."""

    def __init__(self, exporter: InMemorySpanExporter) -> None:
        self.exporter = exporter
        self.loop = asyncio.get_running_loop()
        self.ended = asyncio.Event()

    def on_end(self, span: ReadableSpan) -> None:
        self.loop.call_soon_threadsafe(self.ended.set)

    async def until(
        self, found: Callable[[tuple[ReadableSpan, ...]], Any], timeout: float = 60.0
    ) -> Any:
        """What ``found`` returns for the spans ended so far, once it is truthy."""
        async with asyncio.timeout(timeout):
            while True:
                self.ended.clear()
                if result := found(finished(self.exporter)):
                    return result
                await self.ended.wait()


@dataclass
class Startup:
    """What a client watching health saw while the server started."""

    readiness: list[int] = field(default_factory=list)  # every status of "readiness", in order
    liveness: int | None = None  # "liveness" asked while readiness was still NOT_SERVING


@dataclass(frozen=True)
class InProcess:
    server: MmgateServer
    exporter: InMemorySpanExporter
    watch: SpanWatch
    receiver: OtlpReceiver
    startup: Startup


async def start_watched(server: MmgateServer) -> Startup:
    """Start ``server`` while a client watches its readiness from the moment the port opens."""
    starting = asyncio.ensure_future(server.start())  # the port opens first, then the engine
    seen = Startup()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{server.port}")
    health = health_pb2_grpc.HealthStub(channel)
    try:
        readiness = health.Watch(
            health_pb2.HealthCheckRequest(service=READINESS), timeout=120, wait_for_ready=True
        )
        async for update in readiness:
            seen.readiness.append(int(update.status))
            if update.status == health_pb2.HealthCheckResponse.SERVING:
                break
            if seen.liveness is None:
                alive = await health.Check(health_pb2.HealthCheckRequest(service=LIVENESS))
                seen.liveness = int(alive.status)
        readiness.cancel()
        await starting
    finally:
        await channel.close()
        if not starting.done():
            starting.cancel()
            await asyncio.gather(starting, return_exceptions=True)
    return seen


__all__ = ["TRACED_SERVICE", "InProcess", "SpanWatch", "Startup", "finished", "start_watched"]


def vllm_worker(server: MmgateServer) -> EngineWorker:
    """The server's engine, where a test reaches into vLLM itself (the server's is the real one
    unless it was handed another factory)."""
    engine = server.engine
    assert isinstance(engine, EngineWorker)
    return engine
