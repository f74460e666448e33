"""The Cache service: what the cache actor and the engine's prefix cache hold, for operators;
and Prefetch, which warms the cache with an image that later requests refer to by digest.

Every answer is about the caller's own tenant. An admin may name another tenant's entries
(``tenant`` in the request) and ask for every tenant's figures; anyone else naming another tenant
is told NOT_FOUND, the same whether that tenant holds the entry or not, and an admin-only call is
PERMISSION_DENIED. Figures of all tenants together (actor, engine, media) are an admin's only.
Prefetch does a request's work, so it passes admission as a Generate call does.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Final, final

import grpc

from cache_actor import CacheEvent, EntryInfo, Stage, TenantStats, Watcher, WatchFilter

from ..config import Settings
from ..errors import EntryNotFound, InvalidRequest, NotPermitted, Violation
from ..keys import is_hex_key
from ..pipeline.cache_front import CacheFront
from ..pipeline.generation import PipelineRef
from ..pipeline.request import MediaCall
from ..pipeline.tenancy import Isolation
from ..proto.mmgate.v1 import cache_pb2 as pb
from ..proto.mmgate.v1 import cache_pb2_grpc
from ..proto.mmgate.v1 import inference_pb2 as inference_pb
from ..wire import ADMIN_ONLY, is_digest
from .admission import Admission
from .auth import Caller, checked_label, current_caller
from .health import HealthMonitor
from .metadata import call_deadline
from .status import ServiceError, answering
from .streams import StreamSlots, bounded_write, end_without_waiting
from .validation import image_input, image_violations

_ACTOR_FIELDS = frozenset(pb.ActorStats.DESCRIPTOR.fields_by_name) - {"hit_ratio"}
# what Cache.Watch may be narrowed to (Stage.ANY, "": every stage)
WATCH_STAGES: Final = frozenset(Stage)


def _checked_key(key: str) -> str:
    if not is_hex_key(key):
        raise InvalidRequest([Violation("key", "a cache key as reported: lowercase hex digits")])
    return key


def _target(key: str, digest: str) -> tuple[str, str]:
    """Exactly one of a cache key or an image digest, checked."""
    if bool(key) == bool(digest):
        raise InvalidRequest([Violation("key", "set exactly one of key or digest")])
    if digest and not is_digest(digest):
        raise InvalidRequest([Violation("digest", "'sha256:' and 64 lowercase hex digits")])
    return (_checked_key(key) if key else ""), digest


def _entries_of(caller: Caller, named: str) -> str:
    """The tenant whose entries a call is about: the caller's own, or (an admin's) the named."""
    if not named or named == caller.tenant:
        return caller.tenant
    if caller.admin:
        return checked_label(named, "tenant")
    # the same answer whether the other tenant holds the entry or not: nothing leaks
    raise EntryNotFound("no such entry")


def _watch_event(event: CacheEvent) -> pb.WatchEvent:
    return pb.WatchEvent(
        sequence=event.sequence,
        kind=event.kind,
        tenant=event.tenant,
        stage=event.stage,
        key=event.key,
        digest=event.label if event.stage.is_media else "",
        bytes=event.nbytes,
        tier=event.tier or "",
        snapshot=event.snapshot,
    )


def _entry_fields(info: EntryInfo) -> dict[str, Any]:
    return {
        "key": info.key,
        "state": info.state,
        "bytes": info.nbytes,
        "age_seconds": info.age_seconds,
        "hits": info.hits,
        "tier": info.tier or "",
        "waiters": info.waiters,
    }


@final
class CacheServicer(cache_pb2_grpc.CacheServicer):
    def __init__(
        self,
        settings: Settings,
        cache: CacheFront,
        pipeline: PipelineRef,
        isolation: Isolation,
        admission: Admission,
        monitor: HealthMonitor,
    ) -> None:
        self.settings = settings
        self.cache = cache
        self.pipeline = pipeline
        self.isolation = isolation
        self.admission = admission
        # the engine as the watchdog sees it: GetStats answers before the engine has started
        self.engine = monitor.engine
        self.engine_health = monitor.engine_health
        self._watchers = StreamSlots("cache watchers", settings.cache.max_watchers_per_tenant)

    async def GetStats(
        self, request: pb.GetStatsRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetStatsResponse:
        caller = current_caller()
        async with answering(context):
            if request.all_tenants and not caller.admin:
                raise NotPermitted("all_tenants is an admin's", ADMIN_ONLY)
        media = self.pipeline.media_stats
        response = pb.GetStatsResponse(
            model=self.engine.model_name,
            media_mode=self.pipeline.media_mode,
            engine_health=pb.EngineHealth(**dataclasses.asdict(self.engine_health())),
            tenant=caller.tenant,
            tenants=[self._tenant_stats(t) for t in self._tenants(request, caller.tenant)],
        )
        if caller.admin:
            stats = self.cache.stats()
            values = dataclasses.asdict(stats)
            response.actor.CopyFrom(
                pb.ActorStats(
                    **{name: values[name] for name in _ACTOR_FIELDS}, hit_ratio=stats.hit_ratio
                )
            )
            e = self.engine.stats()
            response.engine.CopyFrom(
                pb.EngineCacheStats(
                    **dataclasses.asdict(e), prefix_cache_hit_ratio=e.prefix_cache_hit_ratio
                )
            )
            response.media.CopyFrom(pb.MediaStats(**dataclasses.asdict(media)))
            video = self.pipeline.video_stats
            response.video.CopyFrom(pb.VideoStats(**dataclasses.asdict(video)))
        return response

    def _tenants(self, request: pb.GetStatsRequest, tenant: str) -> list[TenantStats]:
        """The caller's tenant, or (all_tenants) every tenant the cache knows and every tenant
        with a request in progress: one that never touched a cache is still there."""
        if not request.all_tenants:
            return list(self.cache.tenant_stats(tenant))
        known = list(self.cache.tenant_stats(None))
        named = {stats.tenant for stats in known}
        for active in sorted(set(self.admission.by_tenant) - named):
            known.extend(self.cache.tenant_stats(active))
        return known

    def _tenant_stats(self, stats: TenantStats) -> pb.TenantStats:
        fields = dataclasses.asdict(stats)
        return pb.TenantStats(
            **fields,
            hit_ratio=stats.hit_ratio,
            active_requests=self.admission.active_of(stats.tenant),
            max_concurrent_requests=self.admission.quotas.concurrent_requests(),
        )

    async def Prefetch(
        self, request: pb.PrefetchRequest, context: grpc.aio.ServicerContext
    ) -> pb.PrefetchResponse:
        caller = current_caller()
        tenant = caller.tenant
        async with answering(context):
            with self.admission.enter(tenant, admin=caller.admin):
                deadline = call_deadline(context, self.settings.default_deadline_seconds)
                pipeline = self.pipeline.get()
                pipeline.check_ready(with_images=True)
                image = inference_pb.Image(data=request.data, mime_type=request.mime_type)
                if violations := image_violations(image, self.settings):
                    raise InvalidRequest(violations)
                source = image_input(0, image)
                media_call = MediaCall(self.isolation.media_tenant(tenant), deadline)
                try:
                    report = await pipeline.media.prefetch(source, media_call)
                except InvalidRequest as invalid:
                    # the stage names the image as in a GenerateRequest; here it is `data`
                    raise InvalidRequest(
                        [Violation("data", v.description) for v in invalid.violations]
                    ) from None
        return pb.PrefetchResponse(
            digest=report.digest, outcome=report.outcome, tier=report.tier, form=report.form
        )

    def _entries(
        self, request: pb.InspectRequest | pb.InvalidateRequest
    ) -> tuple[str, str, str, str]:
        """The key or image digest a call names, the tenant whose entries it is about, and
        that tenant's image namespace."""
        key, digest = _target(request.key, request.digest)
        tenant = _entries_of(current_caller(), request.tenant)
        return key, digest, tenant, self.isolation.media_tenant(tenant)

    async def Inspect(
        self, request: pb.InspectRequest, context: grpc.aio.ServicerContext
    ) -> pb.InspectResponse:
        async with answering(context):
            key, digest, tenant, media_tenant = self._entries(request)
            if key:
                info = await self.cache.inspect(key, tenant=tenant)
                if info.state == "absent" and media_tenant != tenant:
                    info = await self.cache.inspect(key, tenant=media_tenant)
                return pb.InspectResponse(**_entry_fields(info))
            stages = [
                pb.StageEntry(
                    stage=stage, **_entry_fields(await self.cache.inspect(k, tenant=media_tenant))
                )
                for stage, k in self.pipeline.get().media.stage_keys(digest).items()
            ]
        held = [s for s in stages if s.state != "absent"]
        return pb.InspectResponse(
            key=digest,
            state=held[-1].state if held else "absent",
            bytes=sum(s.bytes for s in held),
            stages=stages,
        )

    async def Invalidate(
        self, request: pb.InvalidateRequest, context: grpc.aio.ServicerContext
    ) -> pb.InvalidateResponse:
        async with answering(context):
            key, digest, tenant, media_tenant = self._entries(request)
            # (tenant, stage, key): an image's keys by stage, in the images' namespace; a raw
            # key may be in any stage, in the tenant's namespace or (media shared) the shared one
            keys: list[tuple[str, Stage | None, str]]
            if key:
                keys = [(t, None, key) for t in dict.fromkeys((tenant, media_tenant))]
            else:
                stages = self.pipeline.get().media.stage_keys(digest).items()
                keys = [(media_tenant, stage, k) for stage, k in stages]
            removed = [
                await self.cache.invalidate(k, tenant=t, stage=stage) for t, stage, k in keys
            ]
        return pb.InvalidateResponse(removed=any(removed))

    async def Watch(self, request: pb.WatchRequest, context: grpc.aio.ServicerContext) -> None:
        """What the store does for the caller's tenant, as it happens: the journal's events of
        the tenants and stage asked for (cache_actor/events.py), as messages: a snapshot (or
        the events missed since ``since``), "synced", then live events; a watcher that falls
        behind gets one "gap" and its stream ends.

        Sequence numbers count the watched tenant's events alone (1, 2, 3 ...); an admin's
        ``all_tenants`` watch counts every tenant's events together. A tenant holds at most
        ``max_watchers_per_tenant`` of the ``max_watchers`` streams (an admin's count as the
        admin's own tenant's). A client that takes nothing for ``watch_idle_seconds`` while a
        message waits for it (HTTP/2 flow control holds the write) is ended with
        RESOURCE_EXHAUSTED, its slot given back at once; it resumes from the last sequence
        number it saw."""
        caller = current_caller()
        async with answering(context):
            if request.all_tenants and not caller.admin:
                raise NotPermitted("all_tenants is an admin's", ADMIN_ONLY)
            if request.stage not in WATCH_STAGES:
                raise InvalidRequest(
                    [Violation("stage", "one of " + ", ".join(s for s in Stage if s))]
                )
            watching = WatchFilter(
                tenants=(
                    None
                    if request.all_tenants
                    else frozenset({_entries_of(caller, request.tenant)})
                ),
                stage=Stage(request.stage),
            )
            release = self._watchers.take(caller.tenant)
            try:
                watcher, first = await self.cache.watch(
                    watching, request.since, self.settings.cache.watch_buffer
                )
            except BaseException:
                release()
                raise
        idle = self.settings.cache.watch_idle_seconds
        try:
            await _stream(context, watcher, first, idle)
        except TimeoutError:
            # a write held that long: the client reads nothing
            watcher.abandon()
            end_without_waiting(context, _idle(idle))
        finally:
            watcher.close()
            release()


async def _stream(
    context: grpc.aio.ServicerContext, watcher: Watcher, first: list[CacheEvent], idle: float
) -> None:
    """A watcher's events as messages: what it is owed first, its "synced", then live events
    until its gap; each write bounded by ``idle`` (TimeoutError beyond it)."""
    for event in [*first, watcher.synced]:
        await bounded_write(context, _watch_event(event), idle)
    # after its gap (behind, or the cache was emptied), nothing: it resumes or starts over
    while not watcher.ended:
        for event in await watcher.next():
            await bounded_write(context, _watch_event(event), idle)


def _idle(seconds: float) -> ServiceError:
    return ServiceError(
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        f"this watcher read nothing for {seconds:g} s while events waited for it: its stream"
        " ends; resume from the last sequence number it saw",
    )
