"""The Cache service: what the cache actor and the engine's prefix cache hold, for operators."""

from __future__ import annotations

import dataclasses
from typing import Any, final

import grpc

from cache_actor import CacheActor

from .engine import EngineWorker
from .errors import abort, from_exception
from .inference import tenant_of
from .proto.mmgate.v1 import cache_pb2 as pb
from .proto.mmgate.v1 import cache_pb2_grpc
from .validation import InvalidRequest, Violation

_ACTOR_FIELDS = frozenset(pb.ActorStats.DESCRIPTOR.fields_by_name) - {"hit_ratio"}
_KEY_CHARS = frozenset("0123456789abcdef")


def _checked_key(key: str) -> str:
    if not 1 <= len(key) <= 128 or not set(key) <= _KEY_CHARS:
        raise InvalidRequest([Violation("key", "a cache key as reported: lowercase hex digits")])
    return key


@final
class CacheServicer(cache_pb2_grpc.CacheServicer):
    def __init__(self, cache: CacheActor[Any], engine: EngineWorker) -> None:
        self.cache = cache
        self.engine = engine

    async def GetStats(
        self, request: pb.GetStatsRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetStatsResponse:
        stats = self.cache.stats()
        values = dataclasses.asdict(stats)
        actor = pb.ActorStats(
            **{name: values[name] for name in _ACTOR_FIELDS}, hit_ratio=stats.hit_ratio
        )
        e = self.engine.stats()
        engine = pb.EngineCacheStats(
            **dataclasses.asdict(e), prefix_cache_hit_ratio=e.prefix_cache_hit_ratio
        )
        return pb.GetStatsResponse(actor=actor, engine=engine, model=self.engine.model_name)

    async def Inspect(
        self, request: pb.InspectRequest, context: grpc.aio.ServicerContext
    ) -> pb.InspectResponse:
        try:
            info = await self.cache.inspect(_checked_key(request.key), tenant=tenant_of(context))
        except Exception as exc:  # noqa: BLE001 - every failure becomes one clear status
            await abort(context, from_exception(exc))
        return pb.InspectResponse(
            key=info.key,
            state=info.state,
            bytes=info.nbytes,
            age_seconds=info.age_seconds,
            hits=info.hits,
            tier=info.tier or "",
            waiters=info.waiters,
        )

    async def Invalidate(
        self, request: pb.InvalidateRequest, context: grpc.aio.ServicerContext
    ) -> pb.InvalidateResponse:
        try:
            removed = await self.cache.invalidate(
                _checked_key(request.key), tenant=tenant_of(context)
            )
        except Exception as exc:  # noqa: BLE001 - every failure becomes one clear status
            await abort(context, from_exception(exc))
        return pb.InvalidateResponse(removed=removed)
