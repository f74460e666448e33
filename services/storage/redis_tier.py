"""Redis as the cache actor's second tier, shared by every replica (a single server or a Cluster).

    key:    mmgate:{namespace}:{tenant}:{stage}:{key}   namespace: a fingerprint of everything
            that changes a value (the model's files, dtype, processor settings, value format), so
            deployments of different models share one Redis without reading each other's values
    get:    GET ─▶ (a thread) the stage's codec checks (the key it was written under included)
            and decodes ─▶ the value, or a miss
    set:    (a thread) encode, sealed for its key ─▶ over max_value_bytes? skipped, counted
            ─▶ SET PX the stage's TTL
    delete: DEL in the stage(s) ─▶ PUBLISH on mmgate:{namespace}:invalidate: the other replicas
            drop their memory copy (``listen``)
    check:  PING once at start (``check``): a wrong password or an unreachable Redis is told in
            a line, and mmgate serves without the tier until it answers

Only stages with a codec are held here; any other stage is a miss without a round trip. A value
that fails its codec's checks (another format version, truncated, foreign bytes, a value copied
under another key or tenant, a missing or wrong MAC) is a miss,
counted and logged once per reason, never served. Every call is bounded by the actor's tier
timeout (cache_actor's TierIO) and, at the socket, by the client's own timeouts; errors propagate
to the actor, which counts them as misses and opens its breaker on repeated read failures.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Protocol, final
from urllib.parse import urlsplit

from prometheus_client.core import Metric

from cache_actor import Stage

from ..config import RedisSettings
from ..observability.metric_families import tier_families

log = logging.getLogger("mmgate.redis")

# the start check's least bound
CHECK_SECONDS = 2.0

# what a replica does when another one has invalidated (tenant, key)
OnInvalidate = Callable[[str, str], Awaitable[object]]


class StageCodec(Protocol):
    """Turns one stage's values into bytes and back, each bound to the full Redis ``key`` it is
    stored under; ``decode`` raises ValueError on bad bytes or bytes written for another key."""

    def encode(self, value: Any, key: str) -> bytes: ...

    def decode(self, data: bytes, key: str) -> Any: ...


@final
class RedisTier:
    name = "redis"

    def __init__(
        self,
        client: Any,  # redis.asyncio.Redis or redis.asyncio.cluster.RedisCluster
        *,
        codecs: dict[str, StageCodec],
        namespace: str = "",
        ttl_seconds: dict[str, float],
        max_value_bytes: int,
        address: str,
        timeout_seconds: float,
    ) -> None:
        self.client = client
        self.address = address  # host:port, never the URL: it may hold a password
        self.timeout_seconds = timeout_seconds
        self.codecs = codecs
        self.ttl_seconds = ttl_seconds
        self.max_value_bytes = max_value_bytes
        self.use_namespace(namespace)
        self.origin = uuid.uuid4().hex  # this replica, in the invalidations it publishes
        self.bad_values: Counter[str] = Counter()  # reason ─▶ values refused
        self.oversize = 0  # values not written: over max_value_bytes
        self.invalidations_received = 0
        self._listener: asyncio.Task[None] | None = None

    def collect(self) -> Iterator[Metric]:
        """Values read back that failed a check (metrics.py)."""
        return tier_families(sum(self.bad_values.values()))

    def use_namespace(self, namespace: str) -> None:
        """Set once, before the first lookup (the server knows it once the model is known)."""
        self.namespace = namespace
        self.channel = f"mmgate:{namespace}:invalidate"

    def redis_key(self, tenant: str, stage: str, key: str) -> str:
        return f"mmgate:{self.namespace}:{tenant}:{stage}:{key}"

    async def get(self, tenant: str, key: str, *, stage: str, timeout: float) -> Any | None:
        codec = self.codecs.get(stage)
        if codec is None:
            return None  # a stage this tier does not hold
        stored_under = self.redis_key(tenant, stage, key)
        data = await self.client.get(stored_under)
        if data is None:
            return None
        if len(data) > self.max_value_bytes:
            self._refuse(stage, "larger than max_value_bytes")
            return None
        try:
            # a multi-MB digest and decode: off the event loop
            return await asyncio.to_thread(codec.decode, data, stored_under)
        except ValueError as exc:
            self._refuse(stage, str(exc))
            return None

    def _refuse(self, stage: str, reason: str) -> None:
        counted = f"{stage}: {reason}"
        if counted not in self.bad_values:
            log.warning("redis: a %s value was refused and read as a miss: %s", stage, reason)
        self.bad_values[counted] += 1

    async def set(self, tenant: str, key: str, value: Any, *, stage: str, timeout: float) -> None:
        codec = self.codecs.get(stage)
        if codec is None:
            return
        stored_under = self.redis_key(tenant, stage, key)
        data = await asyncio.to_thread(codec.encode, value, stored_under)
        if len(data) > self.max_value_bytes:
            self.oversize += 1
            return
        ttl = self.ttl_seconds.get(stage)
        await self.client.set(stored_under, data, px=int(ttl * 1000) if ttl else None)

    async def delete(self, tenant: str, key: str, *, stage: str | None, timeout: float) -> None:
        stages = list(self.codecs) if stage is None else [stage]
        # one DEL per key: in a Cluster the stages' keys live in different slots
        for name in stages:
            await self.client.delete(self.redis_key(tenant, name, key))
        message = {"tenant": tenant, "key": key, "origin": self.origin}
        await self.client.publish(self.channel, json.dumps(message))

    async def check(self) -> str | None:
        """One authenticated round trip: None when Redis answers, else why not, in a line."""
        from redis.exceptions import RedisClusterException

        try:
            # a first connect is a TCP (and TLS) handshake and an AUTH: more than one call's bound
            async with asyncio.timeout(max(self.timeout_seconds, CHECK_SECONDS)):
                await self.client.ping()
        except Exception as exc:  # noqa: BLE001 - told in a line: the tier is optional
            # a Cluster client wraps what its startup nodes answered
            cause = exc.__cause__ if isinstance(exc, RedisClusterException) else None
            return self._failure(cause or exc)
        return None

    def _failure(self, exc: BaseException) -> str:
        from redis.exceptions import (
            AuthenticationError,
            AuthenticationWrongNumberOfArgsError,
            AuthorizationError,
            NoPermissionError,
        )
        from redis.exceptions import ConnectionError as RedisConnectionError
        from redis.exceptions import TimeoutError as RedisTimeoutError

        # AuthenticationError is a ConnectionError: asked first
        refused = (
            AuthenticationError,
            AuthenticationWrongNumberOfArgsError,
            AuthorizationError,
            NoPermissionError,
        )
        if isinstance(exc, refused):
            return "Redis refused the credentials"
        if isinstance(exc, RedisConnectionError | RedisTimeoutError | OSError):
            return f"Redis is not reachable at {self.address}"
        # the error's text is Redis's and may quote a command or the URL: its type only
        return f"Redis failed the check ({type(exc).__name__})"

    # ── invalidations from the other replicas ───────────────────────────────────────────────

    async def open(self, namespace: str, on_invalidate: OnInvalidate) -> None:
        """Once the model is known: its namespace, the other replicas' invalidations, and the
        start check, whose failure is logged (mmgate serves without the tier meanwhile)."""
        self.use_namespace(namespace)
        self.listen(on_invalidate)
        log.info("second tier: redis, namespace %s", namespace[:16])
        problem = await self.check()
        if problem is not None:
            log.warning(
                "second tier: %s; serving without it until it answers (every lookup is a miss)",
                problem,
            )

    def listen(self, on_invalidate: OnInvalidate) -> None:
        """Subscribe to the other replicas' invalidations (until ``close``)."""
        self._listener = asyncio.create_task(
            self._listen(on_invalidate), name="mmgate-redis-invalidations"
        )

    async def _listen(self, on_invalidate: OnInvalidate) -> None:
        while True:
            pubsub = None
            try:
                # a Cluster client must know the slots before a pubsub can pick its node
                await self.client.initialize()
                pubsub = self.client.pubsub()
                await pubsub.subscribe(self.channel)
                while True:
                    message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                    if message is not None:
                        await self._on_message(message, on_invalidate)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - Redis down: retry, the tier is optional
                log.debug("redis: invalidation listener: %r; retrying", exc)
                await asyncio.sleep(1.0)
            finally:
                if pubsub is not None:
                    with contextlib.suppress(Exception):
                        await pubsub.aclose()

    async def _on_message(self, message: Any, on_invalidate: OnInvalidate) -> None:
        if message.get("type") != "message":
            return
        try:
            body = json.loads(message["data"])
            tenant, key, origin = body["tenant"], body["key"], body["origin"]
        except (TypeError, ValueError, KeyError):
            log.warning("redis: an invalidation that is not mmgate's was ignored")
            return
        if origin == self.origin:
            return
        self.invalidations_received += 1
        await on_invalidate(str(tenant), str(key))

    async def close(self) -> None:
        if self._listener is not None:
            self._listener.cancel()
            await asyncio.gather(self._listener, return_exceptions=True)
        await self.client.aclose()


def redis_address(url: str) -> str:
    """host:port of a Redis URL, for messages: never its user or password."""
    parts = urlsplit(url)
    if parts.scheme == "unix":
        return parts.path
    host = parts.hostname or "localhost"
    if ":" in host:
        host = f"[{host}]"
    try:
        port = parts.port or 6379
    except ValueError:
        return host
    return f"{host}:{port}"


def redis_client(settings: RedisSettings) -> Any:
    """A client for ``settings.url``: one server, or a Cluster found from one of its nodes."""
    assert settings.url is not None
    options: dict[str, Any] = {
        "socket_timeout": settings.timeout_seconds,
        "socket_connect_timeout": settings.timeout_seconds,
    }
    if settings.tls_ca_file is not None:
        options["ssl_ca_certs"] = str(settings.tls_ca_file)
    if settings.cluster:
        from redis.asyncio.cluster import RedisCluster

        return RedisCluster.from_url(settings.url, **options)
    from redis.asyncio import Redis

    return Redis.from_url(settings.url, **options)


def redis_weaknesses(settings: RedisSettings) -> list[str]:
    """What a deployment's Redis settings leave open, said once at start (docs/security.md)."""
    weaknesses = []
    if settings.url is not None and not urlsplit(settings.url).password:
        weaknesses.append(
            "no password in MMGATE_REDIS__URL: anyone who reaches Redis reads and writes every"
            " tenant's values"
        )
    if settings.value_secret_file is None:
        weaknesses.append(
            "no MMGATE_REDIS__VALUE_SECRET_FILE: a value that names its own key is served to"
            " that key's tenant, so whoever can write to Redis can answer for any tenant"
        )
    return weaknesses


@final
class NoTierFigures:
    """A replica without a second tier: nothing refused, and the series says so."""

    def collect(self) -> Iterator[Metric]:
        return tier_families(0)


def redis_tier(
    settings: RedisSettings, codecs: Callable[[bytes | None], dict[str, StageCodec]]
) -> RedisTier | None:
    """The tier the settings name, or None (no second tier: every replica on its own).
    ``codecs`` makes the stages' codecs from the deployment's value secret, if one is set."""
    if settings.url is None:
        return None
    secret = None
    if settings.value_secret_file is not None:
        secret = settings.value_secret_file.read_bytes().strip()
        if not secret:
            raise ValueError(f"the Redis value secret file {settings.value_secret_file} is empty")
    for weakness in redis_weaknesses(settings):
        log.warning("redis: %s", weakness)
    return RedisTier(
        redis_client(settings),
        codecs=codecs(secret),
        ttl_seconds={
            Stage.EMBEDDING: settings.embedding_ttl_seconds,
            Stage.RESPONSE: settings.response_ttl_seconds,
            Stage.VIDEO: settings.video_ttl_seconds,
            Stage.VIDEO_EMBEDDING: settings.embedding_ttl_seconds,
        },
        max_value_bytes=settings.max_value_bytes,
        address=redis_address(settings.url),
        timeout_seconds=settings.timeout_seconds,
    )


__all__ = [
    "NoTierFigures",
    "OnInvalidate",
    "RedisTier",
    "StageCodec",
    "redis_address",
    "redis_client",
    "redis_tier",
    "redis_weaknesses",
]
