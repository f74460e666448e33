"""Metrics without an engine: the lookup hook on a real cache actor, the gRPC interceptor on a real
grpc.aio server over loopback, the exported families through promtool."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Iterator
from importlib import metadata

import grpc
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric

from cache_actor import CacheActor, CacheConfig, CacheRecursionError, Stage
from services.api.interceptors.metrics import metrics_interceptors
from services.api.interceptors.wrapping import final_status
from services.config import Settings
from services.engine.stats import TokenCounters
from services.engine.worker import EngineWorker
from services.observability.metric_families import media_outcome
from services.observability.metrics import LookupMetrics, Metrics
from services.types import TIME_TO_FIRST_TOKEN_BUCKETS, EngineHealth, MediaStats
from tests.support import until

from ..prom import DASHBOARD_NAMES, Scrape, parse, promtool_problems, service_families

SETTINGS = Settings(metrics={"port": 0})


def scrape(metrics: Metrics) -> Scrape:
    return parse(generate_latest(metrics.registry).decode())


# ── the lookup hook ────────────────────────────────────────────────────────────────────────


@pytest.fixture
async def observed() -> AsyncIterator[tuple[Metrics, CacheActor]]:
    metrics = Metrics(SETTINGS)
    cache: CacheActor = CacheActor(CacheConfig(), hook=metrics.lookup_hook)
    cache.start()
    try:
        yield metrics, cache
    finally:
        await cache.aclose()


async def test_lookups_are_counted_by_stage_outcome_and_tier(
    observed: tuple[Metrics, CacheActor],
) -> None:
    metrics, cache = observed
    release = asyncio.Event()
    started = asyncio.Event()

    async def slow() -> str:
        started.set()
        await release.wait()
        return "value"

    prompt = Stage.PROMPT.tier_use
    leader = asyncio.ensure_future(cache.get("a", slow, tier=prompt))
    await started.wait()
    follower = asyncio.ensure_future(cache.get("a", slow, tier=prompt))
    await until(lambda: cache.stats().waiters == 2)
    release.set()
    assert (await leader).outcome.value == "miss"
    assert (await follower).outcome.value == "coalesced"
    await cache.get("a", slow, tier=prompt)  # stored: a hit

    async def own_key() -> str:
        # asks for itself: refused at once
        await cache.get("b", own_key, tier=Stage.IMAGE.tier_use)
        return "never"

    async def broken() -> str:
        raise ValueError("corrupt")

    async def endless() -> str:
        await asyncio.Event().wait()
        return "never"

    embedding = Stage.EMBEDDING.tier_use
    with pytest.raises(CacheRecursionError):
        await cache.get("b", own_key, tier=embedding)
    with pytest.raises(ValueError, match="corrupt"):
        await cache.get("c", broken, tier=embedding)
    with pytest.raises(TimeoutError):
        await cache.get("d", endless, timeout=0.05, tier=embedding)
    entered = asyncio.Event()

    async def endless_once_entered() -> str:
        entered.set()
        return await endless()

    waiting = asyncio.ensure_future(cache.get("e", endless_once_entered, tier=embedding))
    await entered.wait()  # the flight runs: its lookup is waiting on it
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting

    hook = metrics.lookup_hook
    assert isinstance(hook, LookupMetrics)
    lookups = hook.counts  # exported at scrape time with the rest of the snapshot
    assert lookups == {
        ("prompt", "miss", "none"): 1,
        ("prompt", "coalesced", "none"): 1,
        ("prompt", "hit", "memory"): 1,
        ("image", "rejected", "none"): 1,
        # the outer lookup fails with its computation's error: the same refusal
        ("embedding", "rejected", "none"): 1,
        ("embedding", "error", "none"): 1,
        ("embedding", "timeout", "none"): 1,
        ("embedding", "cancelled", "none"): 1,
    }
    s = scrape(metrics)
    durations = s.value("mmgate_actor_lookup_duration_seconds_count", stage="embedding")
    assert durations == 4
    assert s.value("mmgate_actor_lookup_duration_seconds_count", stage="prompt") == 3


def test_a_value_from_any_tier_is_a_media_hit() -> None:
    assert media_outcome("hit", "memory") == "hit"
    assert media_outcome("miss", "redis") == "hit"
    assert media_outcome("miss", "none") == "miss"
    assert media_outcome("coalesced", "none") == "coalesced"
    assert media_outcome("timeout", "none") == "timeout"


# ── the exported families ──────────────────────────────────────────────────────────────────


async def families_of(cache: CacheActor, lookups: dict[tuple[str, str, str], int]) -> list[Metric]:
    engine = EngineWorker(SETTINGS.engine)
    return service_families(
        cache=cache.stats(),
        mailbox_capacity=cache.config.mailbox_size,
        lookups=lookups,
        engine=dataclasses.replace(engine.stats(), prefix_cache_queries=400, prefix_cache_hits=100),
        health=EngineHealth("stalled", in_flight=2, seconds_since_step=3.5, stalls=1),
        model="tiny",
        media=MediaStats(decodes=2),
        media_mode="embeddings",
        max_concurrent_requests=16,
        loop_tasks=12,
        tier_refused=2,
        chaos={("decode", "fail"): 3, ("loop_block", "block"): 1},
    )


class Fixed:
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self.families)


async def test_every_family_passes_promtool(observed: tuple[Metrics, CacheActor]) -> None:
    _, cache = observed
    outcomes = ("hit", "miss", "coalesced", "rejected", "timeout", "cancelled", "error")
    lookups = {
        (stage_name, outcome, "memory" if outcome == "hit" else "none"): 1
        for stage_name in ("prompt", "response", "image", "embedding")
        for outcome in outcomes
    }
    registry = CollectorRegistry()
    registry.register(Fixed(await families_of(cache, lookups)))
    # the service's families, and the interceptor's and the hook's (no samples yet)
    text = generate_latest(registry).decode() + generate_latest(Metrics(SETTINGS).registry).decode()
    assert promtool_problems(text) == ""
    exported = parse(text)
    missing = {name for name in DASHBOARD_NAMES if f"# TYPE {name} " not in text}
    assert missing == set()
    # media: image and embedding lookups; hits and joins are served from the cache
    assert exported.value("mmgate_cache_media_lookups_total", tier="memory", outcome="hit") == 2
    assert exported.value("mmgate_cache_hit_ratio", level="media") == pytest.approx(4 / 14)
    assert exported.value("mmgate_cache_hit_ratio", level="page") == 0.25
    assert exported.value("vllm_cache_hit_rate") == 0.25
    assert exported.value("mmgate_cache_hit_ratio", level="prefix") == 0.0
    assert exported.value("mmgate_media_decodes_total") == 2
    info = {"model": "tiny", "media_mode": "embeddings", "version": metadata.version("mmgate")}
    assert exported.value("mmgate_info", **info) == 1
    assert exported.value("mmgate_chaos_enabled") == 1
    assert exported.value("mmgate_event_loop_tasks") == 12
    assert exported.value("mmgate_chaos_faults_total", point="decode", fault="fail") == 3


def test_time_to_first_token_buckets_hold_their_upper_bound() -> None:
    tokens = TokenCounters()
    tokens.add(10, 3, [0.01, 0.3, 1000.0])
    stats = tokens.snapshot()
    counts = list(stats.time_to_first_token_counts)
    assert len(counts) == len(TIME_TO_FIRST_TOKEN_BUCKETS) + 1
    assert counts[0] == 1  # le=0.01 holds 0.01
    assert counts[TIME_TO_FIRST_TOKEN_BUCKETS.index(0.5)] == 1
    assert counts[-1] == 1  # +Inf
    assert (stats.prompt_tokens, stats.generation_tokens) == (10, 3)
    assert stats.time_to_first_token_sum == pytest.approx(1000.31)


# ── the gRPC interceptor ───────────────────────────────────────────────────────────────────

SERVICE = "test.Probe"


class Probe:
    """Handlers of every form grpc.aio takes; ``entered`` and ``left`` sequence the tests."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.left = asyncio.Event()

    async def echo(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return request

    async def refuse(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "bad")
        raise AssertionError("abort returned")

    async def not_found(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        context.set_code(grpc.StatusCode.NOT_FOUND)
        return b""

    async def crash(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        raise ValueError("bug")

    async def hang(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        self.entered.set()
        try:
            await asyncio.Event().wait()
        finally:
            self.left.set()
        return b""

    async def count(
        self, request: bytes, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        for i in range(3):
            yield bytes([i])

    async def write(self, request: bytes, context: grpc.aio.ServicerContext) -> None:
        for i in range(2):
            await context.write(bytes([i]))

    async def chat(
        self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        async for request in requests:
            yield request


@pytest.fixture
async def probe() -> AsyncIterator[tuple[Probe, Metrics, grpc.aio.Channel]]:
    metrics = Metrics(SETTINGS)
    probe = Probe()
    server = grpc.aio.server(interceptors=metrics_interceptors(metrics))
    unary = {
        name: grpc.unary_unary_rpc_method_handler(getattr(probe, name))
        for name in ("echo", "refuse", "not_found", "crash", "hang")
    }
    streams = {
        "count": grpc.unary_stream_rpc_method_handler(probe.count),
        "write": grpc.unary_stream_rpc_method_handler(probe.write),
        "chat": grpc.stream_stream_rpc_method_handler(probe.chat),
    }
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(SERVICE, {**unary, **streams}),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield probe, metrics, channel
    finally:
        await server.stop(0)


def method(name: str) -> str:
    return f"/{SERVICE}/{name}"


async def test_each_call_is_counted_with_the_code_the_client_sees(
    probe: tuple[Probe, Metrics, grpc.aio.Channel],
) -> None:
    _, metrics, channel = probe
    seen: dict[str, grpc.StatusCode] = {}
    for name in ("echo", "refuse", "not_found", "crash"):
        try:
            await channel.unary_unary(method(name))(b"x", timeout=10)
            seen[name] = grpc.StatusCode.OK
        except grpc.aio.AioRpcError as error:
            seen[name] = error.code()
    assert [b async for b in channel.unary_stream(method("count"))(b"", timeout=10)] == [
        b"\0",
        b"\1",
        b"\2",
    ]
    assert len([b async for b in channel.unary_stream(method("write"))(b"", timeout=10)]) == 2
    chat = channel.stream_stream(method("chat"))(timeout=10)
    await chat.write(b"a")
    assert await chat.read() == b"a"
    await chat.done_writing()
    assert await chat.code() == grpc.StatusCode.OK

    s = scrape(metrics)
    assert {name: code.name for name, code in seen.items()} == {
        "echo": "OK",
        "refuse": "INVALID_ARGUMENT",
        "not_found": "NOT_FOUND",
        "crash": "UNKNOWN",
    }
    for name, code in seen.items():
        assert s.value("mmgate_grpc_requests_total", method=method(name), code=code.name) == 1
    for name in ("count", "write", "chat"):
        assert s.value("mmgate_grpc_requests_total", method=method(name), code="OK") == 1
        assert s.value("mmgate_grpc_request_duration_seconds_count", method=method(name)) == 1
        assert s.value("mmgate_grpc_streams_in_flight", method=method(name)) == 0


async def test_a_cancelled_call_and_an_expired_deadline(
    probe: tuple[Probe, Metrics, grpc.aio.Channel],
) -> None:
    handlers, metrics, channel = probe
    hang = channel.unary_unary(method("hang"))
    call = hang(b"", timeout=60)
    await handlers.entered.wait()
    assert scrape(metrics).value("mmgate_grpc_streams_in_flight", method=method("hang")) == 1
    call.cancel()
    # the handler's finally runs, then the interceptor's in the same step of the server's task
    await handlers.left.wait()
    s = scrape(metrics)
    assert s.value("mmgate_grpc_requests_total", method=method("hang"), code="CANCELLED") == 1
    assert s.value("mmgate_grpc_streams_in_flight", method=method("hang")) == 0

    handlers.entered.clear()
    handlers.left.clear()
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await hang(b"", timeout=0.2)
    assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    await handlers.left.wait()
    s = scrape(metrics)
    assert (
        s.value("mmgate_grpc_requests_total", method=method("hang"), code="DEADLINE_EXCEEDED") == 1
    )


class FakeContext:
    def __init__(self, code: grpc.StatusCode | None, remaining: float | None) -> None:
        self._code = code
        self._remaining = remaining

    def code(self) -> grpc.StatusCode | None:
        return self._code

    def time_remaining(self) -> float | None:
        return self._remaining

    def details(self) -> str:
        return ""


@pytest.mark.parametrize(
    ("code", "remaining", "error", "expected"),
    [
        (None, None, None, "OK"),
        (grpc.StatusCode.NOT_FOUND, 5.0, None, "NOT_FOUND"),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, 5.0, RuntimeError("aborted"), "RESOURCE_EXHAUSTED"),
        (None, None, asyncio.CancelledError(), "CANCELLED"),
        (None, 3.0, asyncio.CancelledError(), "CANCELLED"),
        (None, 0.0, asyncio.CancelledError(), "DEADLINE_EXCEEDED"),
        (None, 0.0, GeneratorExit(), "DEADLINE_EXCEEDED"),
        (None, 5.0, ValueError("bug"), "UNKNOWN"),
    ],
)
def test_final_status(
    code: grpc.StatusCode | None,
    remaining: float | None,
    error: BaseException | None,
    expected: str,
) -> None:
    assert final_status(FakeContext(code, remaining), error).code.name == expected
