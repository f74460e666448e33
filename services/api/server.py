"""The grpc.aio server, and the composition root: it builds every part, wires it, runs it.

MmgateServer(settings, engine=factory): auth, tracing, metrics, the cache front (actor and
    tier), the engine (the factory's), health, thread pools, chaos, the URL fetcher, admission,
    servicers, interceptors; each part with figures is added to the metrics where it is built
start:    Pillow's pixel limit, cache actor ─▶ gRPC port open (health NOT_SERVING, liveness SERVING)
          ─▶ the plan (in threads: model prepared, dtype, media plan) ─▶ Redis tier opened
          in its namespace ─▶ engine.start(plan) ─▶ the Pipeline built ─▶ health SERVING
running:  the health monitor (health.py) pings the actor, watches the engine's progress and
          hears the loop's heartbeat; health follows
SIGTERM:  health NOT_SERVING ─▶ new calls refused (UNAVAILABLE) ─▶ in-flight calls get the
          grace period ─▶ the rest cancelled ─▶ pipeline, URL fetcher, engine and actor closed
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
from typing import final

import grpc
from grpc_health.v1._async import HealthServicer

from ..config import Settings
from ..engine.factory import configured_engine
from ..engine.plan import EnginePlan
from ..engine.protocol import EngineFactory
from ..models import resolve_model
from ..observability.metrics import Metrics
from ..observability.tracing import Tracing
from ..pipeline.cache_front import cache_front
from ..pipeline.chaos import injector
from ..pipeline.generation import Pipeline, PipelineRef
from ..pipeline.media import ImageFetcher, MediaPlan, limit_pixels, plan_media
from ..pipeline.tenancy import Isolation
from ..pipeline.threads import ThreadPools
from ..pipeline.tier_values import codecs
from ..storage.namespace import tier_namespace
from ..storage.redis_tier import NoTierFigures, redis_tier
from .admission import Admission
from .auth import AuthGate, announce_trust, authenticator, certificate_files
from .cache_service import CacheServicer
from .grpc_server import CACHE, INFERENCE, add_services, grpc_server, open_port, open_services
from .health import HealthMonitor
from .inference import InferenceServicer
from .interceptors.metrics import metrics_interceptors
from .interceptors.parsing import ParsingInterceptor
from .interceptors.tracing import tracing_interceptors
from .load import LoadReport
from .quotas import TenantQuotas
from .relay import Edges, RelayServicer, relay_server, relayed_handlers

log = logging.getLogger("mmgate.server")

# how long finished calls get to flush their last bytes once the drain is over
FLUSH_SECONDS = 0.5


@final
class MmgateServer:
    """``model``: serve this folder (None: the settings' model, else the embedded default);
    ``tracing``: the caller's (tests hand in their own span processors); ``engine``: what
    builds the engine (a test or a benchmark hands in a fake)."""

    def __init__(
        self,
        settings: Settings,
        *,
        model: str | None = None,
        tracing: Tracing | None = None,
        engine: EngineFactory = configured_engine,
    ) -> None:
        self.settings = settings
        self.model = model
        # who calls: a bad tokens file or certificate refuses to start, before anything else
        self.auth = AuthGate(authenticator(settings.auth), open_services(settings.auth))
        self.quotas = TenantQuotas(settings, self.auth.authenticator.tenants)
        self.tls = certificate_files(settings.auth)
        self.tracing = tracing if tracing is not None else Tracing(settings)
        self.metrics = Metrics(settings)
        self.metrics.add(self.auth)
        # the second tier shared by replicas; its namespace is set once the model is known
        self.tier = redis_tier(settings.redis, codecs)
        self.metrics.add(self.tier if self.tier is not None else NoTierFigures())
        self.cache = cache_front(
            settings,
            self.tier,
            tenant_bytes=self.quotas.cache_bytes(),
            hooks=(self.tracing.lookup_hook, self.metrics.lookup_hook),
        )
        self.metrics.add(self.cache)
        self.engine = engine(settings)
        self.metrics.add(self.engine, self.metrics.cache_levels(self.engine.stats))
        self.health = HealthServicer()
        self.monitor = HealthMonitor(
            settings.health, self.health, self.cache, self.engine, (INFERENCE, CACHE)
        )
        self.metrics.add(self.monitor)
        self.threads = ThreadPools(settings.threads)
        self.metrics.add(self.threads)
        self.chaos = injector(settings.chaos)
        self.metrics.add(self.chaos)
        self.isolation = Isolation(settings.tenants)
        self.fetcher = ImageFetcher(settings.media, self.cache)
        self.metrics.add(self.fetcher)
        self.pipelines = PipelineRef()
        self.metrics.add(self.pipelines)
        self.admission = Admission(
            settings.max_concurrent_requests, self.quotas, settings.admin_reserve
        )
        self.metrics.add(self.admission)
        self.load = LoadReport(
            settings, self.admission, self.engine, self.pipelines, self.threads, self.cache
        )
        self.metrics.add(self.load)
        self.inference = InferenceServicer(
            settings, self.pipelines, self.admission, self.engine, self.load
        )
        self.cache_service = CacheServicer(
            settings, self.cache, self.pipelines, self.isolation, self.admission, self.monitor
        )
        # tracing outermost: its server span covers the metrics interceptor's work too; then
        # the auth gate, whose refusals both see; parsing innermost: a request that is not a
        # message is answered after the caller is known
        interceptors = [
            *tracing_interceptors(self.tracing),
            *metrics_interceptors(self.metrics),
            self.auth,
            ParsingInterceptor(),
        ]
        self.server = grpc_server(settings, interceptors)
        add_services(self.server, self.inference, self.cache_service, self.health)
        # with edges, they hold the port; this server listens on a socket of theirs, and the
        # relayed calls run through the same interceptors and servicer (services/api/relay)
        self.edges = Edges(settings) if settings.edges else None
        self.relay: RelayServicer | None = None
        self.relay_server: grpc.aio.Server | None = None
        if self.edges is None:
            self.port = open_port(self.server, settings, self.tls)
        else:
            self.server.add_insecure_port(f"unix:{self.edges.core_socket}")
            self.relay = RelayServicer(interceptors, relayed_handlers(self.inference))
            self.relay_server = relay_server(self.relay, self.edges.relay_socket)
            self.port = self.edges.port
        self._stopping = False
        self._stopped = asyncio.Event()

    async def start(self) -> None:
        """Open the port at once (health NOT_SERVING), then start the engine."""
        settings = self.settings
        limit_pixels(settings.media.max_image_pixels)
        self.cache.start()
        await self.monitor.starting()
        await self.server.start()
        if self.edges is not None and self.relay is not None and self.relay_server is not None:
            await self.relay_server.start()
            await self.edges.start(self.relay)
        self.auth.start(settings.auth.reload_seconds)
        if self.metrics.enabled:
            self.metrics.start(self.monitor.heartbeat)
        log.info(
            "listening on %s:%d (%s, auth %s); starting the engine",
            settings.host,
            self.port,
            "plaintext" if self.tls is None else "TLS",
            settings.auth.mode,
        )
        announce_trust(settings.auth, settings.host)
        plan, media = await self._plan()
        if self.tier is not None:
            namespace = await asyncio.to_thread(
                tier_namespace,
                plan.model,
                dtype=self.engine.dtype_choice().dtype,
                encoder_dtype=media.encoder_dtype,
                media=settings.media,
            )
            await self.tier.open(namespace, self.cache.forget_copy)
        await self.engine.start(plan)
        stage = media.stage(
            self.cache, self.engine, threads=self.threads, chaos=self.chaos, fetcher=self.fetcher
        )
        self.pipelines.current = Pipeline(
            settings,
            self.engine,
            self.cache,
            stage,
            threads=self.threads,
            chaos=self.chaos,
            isolation=self.isolation,
        )
        log.info("media mode: %s (%s)", stage.mode, stage.description)
        # what start built (torch, vLLM, the model's configs: millions of objects) lives as long
        # as the server: out of the garbage collector's sight, a full collection no longer walks
        # it while every thread waits (a long-served server's held the loop 2.7-5.3 s)
        gc.collect()
        gc.freeze()
        log.info("%d objects built at start left out of garbage collection", gc.get_freeze_count())
        await self.monitor.update()
        self.monitor.start()
        log.info("serving %s on %s:%d", self.engine.model_name, settings.host, self.port)

    async def _plan(self) -> tuple[EnginePlan, MediaPlan]:
        """What the engine starts with: the model (the first start converts the embedded
        default, ~20 s), its dtype and what its images need; read in threads."""
        settings = self.settings
        model = self.model
        if model is None:
            model = await asyncio.to_thread(resolve_model, settings)
        dtype = (await asyncio.to_thread(self.engine.dtype_choice)).dtype
        media = await asyncio.to_thread(
            plan_media,
            settings.media,
            model,
            dtype,
            device_share=settings.engine.gpu_memory_utilization,
        )
        plan = EnginePlan(model, media.intake(), settings.tenants.prioritised, media.device_share)
        return plan, media

    @property
    def pipeline(self) -> Pipeline:
        """The started server's pipeline."""
        return self.pipelines.get()

    async def stop(self, grace: float | None = None) -> None:
        """Drain and close everything; safe to call more than once."""
        if self._stopping:
            await self._stopped.wait()
            return
        self._stopping = True
        grace = self.settings.shutdown_grace_seconds if grace is None else grace
        log.info("shutting down: %g s for calls in flight", grace)
        await self.monitor.stop()
        await self.auth.stop()
        drained = await self.admission.drain(grace)
        if not drained:
            log.warning("grace period over with %d requests in flight", self.admission.active)
        # whatever is left (a stream past the grace period, a health Watch) is cancelled now;
        # after a drain, a moment first: a stream whose handler has just returned may not have
        # flushed its last messages and status, which a close at once would cut off (the client
        # would see "Stream removed" for a stream mmgate had finished)
        if self.edges is not None and self.relay_server is not None:
            # the relayed calls have ended (admission counted them): the edges write their last
            # messages and go, then the Relay streams end
            await self.edges.stop(FLUSH_SECONDS)
            await self.relay_server.stop(0)
        await self.server.stop(FLUSH_SECONDS if drained else 0)
        if self.pipelines.current is not None:
            await self.pipelines.current.close()
        await self.fetcher.aclose()
        await self.engine.close()
        await self.cache.aclose()
        if self.tier is not None:
            await self.tier.close()
        self.metrics.stop()
        await self.tracing.shutdown()
        self._stopped.set()
        log.info("stopped")

    async def wait_stopped(self) -> None:
        await self._stopped.wait()


async def serve(settings: Settings) -> None:
    """Run until SIGTERM or SIGINT, then shut down gracefully."""
    server = MmgateServer(settings)
    loop = asyncio.get_running_loop()
    stopping: set[asyncio.Task[None]] = set()  # holds the task until it is done

    def on_signal() -> None:
        task = asyncio.ensure_future(server.stop())
        stopping.add(task)
        task.add_done_callback(stopping.discard)

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    # SIGHUP: read the tokens file again (it is also polled for changes)
    loop.add_signal_handler(signal.SIGHUP, server.auth.reload)
    try:
        await server.start()
        await server.wait_stopped()
    finally:
        await server.stop()
