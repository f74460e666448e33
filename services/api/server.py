"""The grpc.aio server, and the composition root: it builds every part and wires them.

    MmgateServer: Settings ─▶ Tracing, Metrics, CacheActor (with their lookup hooks),
                  EngineWorker, Admission, the servicers, the interceptors, health; metrics get
                  a snapshot function (nothing reaches through the server from outside)

    start:    cache actor ─▶ gRPC port open (health NOT_SERVING, liveness SERVING)
              ─▶ model prepared (in a thread) ─▶ media plan (pipeline/media/plan.py: the encoder
              loaded in embeddings mode) ─▶ Redis tier opened in its namespace (storage/)
              ─▶ engine started (in a thread) ─▶ the Pipeline built, whole ─▶ health SERVING
    running:  the health monitor (health.py) pings the actor, watches the engine's progress and
              hears the loop's heartbeat; health follows
    SIGTERM:  health NOT_SERVING ─▶ new calls refused (UNAVAILABLE) ─▶ in-flight calls get the
              grace period ─▶ the rest cancelled ─▶ shared-response producers, engine and actor
              closed ─▶ nothing left running

Health services: "" (overall) and each mmgate service follow readiness; "liveness" says the
process is worth keeping (the cache actor answers, the engine has neither died nor hung),
"readiness" that it can serve now (engine stepping, loop not blocked, not shutting down).
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import logging
import signal
from typing import final

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection

from cache_actor import CacheActor, Journal

from ..config import AuthSettings, Settings
from ..engine.dtypes import VERDICTS_FILE, Verdicts
from ..engine.worker import EngineWorker
from ..models import prepare_default_model
from ..observability.lookups import Observers
from ..observability.metric_families import Snapshot
from ..observability.metrics import Metrics
from ..observability.tracing import Tracing
from ..pipeline.cache_front import CacheFront
from ..pipeline.chaos import injector
from ..pipeline.generation import Pipeline, PipelineRef
from ..pipeline.media import plan_media
from ..pipeline.tenancy import Isolation
from ..pipeline.threads import ThreadPools
from ..pipeline.tier_values import codecs
from ..proto.mmgate.v1 import cache_pb2, cache_pb2_grpc, inference_pb2, inference_pb2_grpc
from ..storage.namespace import tier_namespace
from ..storage.redis_tier import redis_tier
from .admission import Admission
from .auth import AuthGate, CertificateFiles, announce_trust, authenticator
from .cache_service import CacheServicer
from .connections import connection_options
from .health import HealthMonitor
from .inference import InferenceServicer
from .interceptors.metrics import metrics_interceptors
from .interceptors.parsing import ParsingInterceptor
from .interceptors.tracing import tracing_interceptors
from .quotas import TenantQuotas

log = logging.getLogger("mmgate.server")

INFERENCE = inference_pb2.DESCRIPTOR.services_by_name["Inference"].full_name
CACHE = cache_pb2.DESCRIPTOR.services_by_name["Cache"].full_name
HEALTH = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name
# how long finished calls get to flush their last bytes once the drain is over
FLUSH_SECONDS = 0.5


def open_services(settings: AuthSettings) -> frozenset[str]:
    """The services callers reach without credentials (the probes', unless protected)."""
    services = set()
    if not settings.protect_health:
        services.add(HEALTH)
    if not settings.protect_reflection:
        services.update({reflection.SERVICE_NAME, "grpc.reflection.v1.ServerReflection"})
    return frozenset(services)


def certificate_files(settings: AuthSettings) -> CertificateFiles | None:
    if settings.tls_cert_file is None or settings.tls_key_file is None:
        return None
    ca = settings.client_ca_file if settings.mode == "mtls" else None
    return CertificateFiles(settings.tls_cert_file, settings.tls_key_file, ca)


def resolve_model(settings: Settings) -> str:
    """The model to serve: the configured one, or the embedded default, prepared once."""
    if settings.engine.model:
        return settings.engine.model
    return str(prepare_default_model(settings.model_cache))


@final
class MmgateServer:
    def __init__(
        self, settings: Settings, *, model: str | None = None, tracing: Tracing | None = None
    ) -> None:
        self.settings = settings
        # who calls: a bad tokens file or certificate refuses to start, before anything else
        self.auth = AuthGate(authenticator(settings.auth), open_services(settings.auth))
        self.quotas = TenantQuotas(settings, self.auth.authenticator.tenants)
        self.tls = certificate_files(settings.auth)
        # tracing: one of the caller's (tests hand in their own span processors)
        self.tracing = tracing if tracing is not None else Tracing(settings)
        self.metrics = Metrics(settings)
        hooks = [h for h in (self.tracing.lookup_hook, self.metrics.lookup_hook) if h is not None]
        # the second tier shared by replicas; its namespace is set once the model is known
        self.tier = redis_tier(settings.redis, codecs)
        config = settings.cache.actor_config(
            settings.redis if self.tier is not None else None,
            tenant_bytes=self.quotas.cache_bytes(),
            max_tenants=settings.tenants.max_labels,
        )
        hook = Observers(hooks) if hooks else None
        # the actor, and a fresh one in its place if it dies (degraded mode: cache_front.py)
        journal = Journal(settings.cache.watch_history, settings.cache.max_watchers)
        self.cache = CacheFront(
            lambda: CacheActor(config, hook=hook, tier=self.tier, journal=journal),
            settings.cache.on_failure,
            journal=journal,
        )
        self.engine = EngineWorker(settings.engine, model)
        # dtype=auto's evidence lives beside the converted models (services/engine/dtypes.py)
        self.engine.verdicts = Verdicts(settings.model_cache / VERDICTS_FILE)
        if settings.tenants.prioritised:
            self.engine.schedule_by_priority()
        self.health = HealthServicer()
        self.monitor = HealthMonitor(
            settings.health, self.health, self.cache, self.engine, (INFERENCE, CACHE)
        )
        # the parts the pipeline shares with the media stage and the metrics; the pipeline
        # itself is built once the engine has started (until then calls get UNAVAILABLE)
        self.threads = ThreadPools(settings.threads)
        self.chaos = injector(settings.chaos)
        self.isolation = Isolation(settings.tenants)
        self.pipelines = PipelineRef()
        self.admission = Admission(
            settings.max_concurrent_requests, self.quotas, settings.admin_reserve
        )
        self.inference = InferenceServicer(settings, self.pipelines, self.admission, self.engine)
        self.cache_service = CacheServicer(
            settings,
            self.cache,
            self.pipelines,
            self.isolation,
            self.admission,
            self.engine,
            self.monitor.engine_health,
        )
        self.server = grpc.aio.server(
            # tracing outermost: its server span covers the metrics interceptor's work too;
            # then the auth gate, whose refusals both see; parsing innermost: a request that is
            # not a message is answered after the caller is known
            interceptors=[
                *tracing_interceptors(self.tracing),
                *metrics_interceptors(self.metrics),
                self.auth,
                ParsingInterceptor(),
            ],
            options=[
                # messages up to twice the limit reach validation, which names the field;
                # beyond that gRPC itself answers RESOURCE_EXHAUSTED
                ("grpc.max_receive_message_length", 2 * settings.max_message_bytes),
                ("grpc.max_send_message_length", settings.max_send_bytes),
                ("grpc.so_reuseport", 0),
                *connection_options(settings.connections),
            ],
        )
        inference_pb2_grpc.add_InferenceServicer_to_server(self.inference, self.server)
        cache_pb2_grpc.add_CacheServicer_to_server(self.cache_service, self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        reflection.enable_server_reflection(
            (
                INFERENCE,
                CACHE,
                HEALTH,
                reflection.SERVICE_NAME,
            ),
            self.server,
        )
        address = f"{settings.host}:{settings.port}"
        if self.tls is None:
            self.port = self.server.add_insecure_port(address)
        else:
            # mtls: a client without a certificate of the client CA fails the handshake, so an
            # unauthenticated caller never reaches a handler (it sees UNAVAILABLE)
            credentials = self.tls.credentials(require_client_cert=settings.auth.mode == "mtls")
            self.port = self.server.add_secure_port(address, credentials)
        self._stopping = False
        self._stopped = asyncio.Event()

    async def start(self) -> None:
        """Open the port at once (health NOT_SERVING), then start the engine."""
        self.cache.start()
        await self.monitor.starting()
        await self.server.start()
        self.auth.start(self.settings.auth.reload_seconds)
        if self.metrics.enabled:
            self.metrics.start(self.snapshot, self.monitor.heartbeat)
        log.info(
            "listening on %s:%d (%s, auth %s); starting the engine",
            self.settings.host,
            self.port,
            "plaintext" if self.tls is None else "TLS",
            self.settings.auth.mode,
        )
        announce_trust(self.settings.auth, self.settings.host)
        engine, media = self.engine, self.settings.media
        if not engine.model_path:
            # the first start converts the embedded default model (~20 s): off the loop
            engine.use_model(await asyncio.to_thread(resolve_model, self.settings))
        plan = await asyncio.to_thread(
            plan_media,
            media,
            engine.model_path,
            engine.dtype,
            device_share=self.settings.engine.gpu_memory_utilization,
        )
        plan.configure(engine)
        if self.tier is not None:
            namespace = await asyncio.to_thread(
                tier_namespace,
                engine.model_path,
                dtype=engine.dtype,
                encoder_dtype=plan.encoder_dtype,
                media=media,
            )
            await self.tier.open(namespace, self._forget)
        await engine.start()
        stage = plan.stage(self.cache, engine, threads=self.threads, chaos=self.chaos)
        self.pipelines.current = Pipeline(
            self.settings,
            engine,
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
        log.info("serving %s on %s:%d", self.engine.model_name, self.settings.host, self.port)

    @property
    def pipeline(self) -> Pipeline:
        """The started server's pipeline."""
        return self.pipelines.get()

    def snapshot(self) -> Snapshot:
        """What metrics export, read from each part at once (on the event loop)."""
        return Snapshot(
            cache=self.cache.stats(),
            mailbox_capacity=self.cache.config.mailbox_size,
            lookups=self.metrics.lookups(),
            engine=self.engine.stats(),
            tokens=self.engine.token_stats(),
            engine_ready=self.engine.ready,
            engine_health=self.monitor.engine_health(),
            threads=self.threads.stats(),
            model=self.engine.model_name,
            media=dataclasses.replace(self.pipelines.media_stats),
            media_mode=self.pipelines.media_mode,
            active_requests=self.admission.active,
            max_concurrent_requests=self.settings.max_concurrent_requests,
            loop_tasks=len(asyncio.all_tasks()),
            tier_refused=0 if self.tier is None else sum(self.tier.bad_values.values()),
            chaos_enabled=self.chaos.enabled,
            chaos_injected=dict(self.chaos.injected),
            auth_refused=dict(self.auth.refused),
            adapters=self.engine.adapter_stats(),
            queue=self.pipelines.queue_stats,
            degraded=self.cache.figures(),
            watch=self.cache.watch_figures(),
            fetch=self.pipelines.fetch_stats,
        )

    async def _forget(self, tenant: str, key: str) -> None:
        """Another replica invalidated a key: drop this replica's memory copy."""
        await self.cache.invalidate(key, tenant=tenant, local=True)

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
        await self.server.stop(FLUSH_SECONDS if drained else 0)
        if self.pipelines.current is not None:
            await self.pipelines.current.close()
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
