"""mmgate replicas behind a real L7 proxy, as the mesh runs them in a cluster, on one machine:
Debian's nginx hashing on x-mmgate-affinity (deploy/proxy/nginx.conf), real `mmgate serve`
replicas on the tiny LLaVA (embeddings mode), one real redis-server shared by them.

`make test` runs the smoke form on the session's two replicas (tests/replicas.py; the storage tests
share them): affinity, and one fail-over (a replica SIGKILLed in the middle of a load), last of
the whole run. `make mesh` (MMGATE_MESH=1) runs the full suite: three replicas, the
fail-over, a rolling restart under load, and a trace through the proxy. Each test writes its
figures to build/mesh/<test>.json; docs/deploy.md quotes them.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import secrets
import signal
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from typing import Any

import grpc
import pytest
import pytest_asyncio

from services.cli.bench.load import Limits, Outcome, one, run
from services.cli.bench.workload import Mix, Workload
from services.client import MmgateClient
from services.models import build_tiny_llava
from services.proto.mmgate.v1 import inference_pb2
from tests import support
from tests.deploy.proxy import Nginx, wait_reloaded
from tests.haproxy import GrpcHashProxy
from tests.redis_support import RedisProcess, redis_server
from tests.replicas import Replicas
from tests.services.imagegen import png
from tests.services.otlp_receiver import OtlpReceiver
from tests.support import ROOT, RunningServer, eventually, wait_serving

pytestmark = pytest.mark.asyncio(loop_scope="module")

FULL = os.environ.get("MMGATE_MESH") == "1"
REPLICAS = 3 if FULL else 2
RESULTS = ROOT / "build" / "mesh"
IMAGES = [png(7100 + i) for i in range(12)]
QUESTION = "<image> Describe the picture."


def record(name: str, figures: dict[str, Any]) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps({"replicas": REPLICAS, **figures}, indent=2))


@pytest.fixture(scope="module")
def redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisProcess]:
    server = redis_server(tmp_path_factory.mktemp("mesh-redis"))
    yield server
    server.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def otlp() -> AsyncIterator[OtlpReceiver]:
    """Jaeger's stand-in: an OTLP receiver the replicas export their spans to (make mesh)."""
    receiver = OtlpReceiver()
    await receiver.start()
    yield receiver
    await receiver.stop()


@pytest.fixture(scope="module")
def replicas(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Replicas]:
    """The smoke form: the session's two replicas (the storage tests share them); make mesh:
    three of its own, exporting traces, which the rolling restart starts again."""
    if not FULL:
        yield request.getfixturevalue("shared_replicas")
        return
    redis: RedisProcess = request.getfixturevalue("redis")
    otlp: OtlpReceiver = request.getfixturevalue("otlp")
    model = build_tiny_llava(tmp_path_factory.mktemp("models") / "tiny-llava")
    group = Replicas(
        tmp_path_factory.mktemp("replicas"),
        model,
        redis.url,
        MMGATE_TRACING__ENDPOINT=f"127.0.0.1:{otlp.port}",
    )
    group.start_all(REPLICAS)
    try:
        yield group
    finally:
        group.stop()


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory, replicas: Replicas) -> Iterator[Nginx]:
    nginx = Nginx(tmp_path_factory.mktemp("nginx"), [s.port for s in replicas.servers]).start()
    try:
        wait_serving(nginx.target, 60)
        yield nginx
    finally:
        nginx.stop()


async def ask(client: MmgateClient, data: bytes) -> inference_pb2.CompleteResponse:
    return await client.complete(QUESTION, images=[data], max_tokens=2, temperature=0.0)


async def holders(replicas: Replicas, data: bytes) -> list[int]:
    """The replicas (by index) whose memory holds the image's encoder output."""
    from services.client import digest_of

    held = []
    for index, server in enumerate(replicas.servers):
        if server.process.poll() is not None:
            continue
        async with server.client(timeout=30.0) as direct:
            entry = await direct.inspect(digest=digest_of(data))
        if any(s.stage == "embedding" and s.state == "stored" for s in entry.stages):
            held.append(index)
    return held


async def test_the_same_image_meets_the_same_replica_and_images_spread(
    replicas: Replicas, proxy: Nginx
) -> None:
    async with MmgateClient(proxy.target, timeout=120.0) as client:
        first = [await ask(client, data) for data in IMAGES]
        again = [await ask(client, data) for data in IMAGES]
    # every repeat was a hit in memory: it met the replica that had encoded it
    assert [r.final.cache.images[0].outcome for r in first] == ["miss"] * len(IMAGES)
    assert {(r.final.cache.images[0].outcome, r.final.cache.images[0].tier) for r in again} == {
        ("hit", "memory")
    }
    held = [await holders(replicas, data) for data in IMAGES]
    assert all(len(h) == 1 for h in held), held  # one replica each: none was encoded twice
    spread = Counter(h[0] for h in held)
    # different images spread: a hash ring over a dozen keys need not touch every replica
    assert len(spread) >= 2, spread
    record("affinity", {"images": len(IMAGES), "per_replica": dict(sorted(spread.items()))})


# Bounded loads: one image is HOT_SHARE of the calls, the rest spread over COLD images; WORKERS
# calls in flight, four a replica, so that the factor's bound is a whole number of calls
HOT_SHARE = 0.6
COLD = 12
BALANCE_FACTOR = 125  # percent of the average load a replica may take (hash-balance-factor)
WORKERS = 4 * REPLICAS
CALLS = 40 * REPLICAS


async def hashed_load(target: str, images: list[bytes], seed: int) -> list[tuple[int, str, str]]:
    """CALLS calls, WORKERS at a time: image 0 (hot) HOT_SHARE of them, the others at random;
    each call's image index, outcome and tier, in the order they ended."""
    rng = random.Random(seed)
    plan = [0 if rng.random() < HOT_SHARE else rng.randrange(1, len(images)) for _ in range(CALLS)]
    pending = iter(plan)
    ended: list[tuple[int, str, str]] = []

    async def worker(client: MmgateClient) -> None:
        for index in pending:
            report = (await ask(client, images[index])).final.cache.images[0]
            ended.append((index, report.outcome, report.tier))

    async with MmgateClient(target, timeout=120.0) as client:
        await asyncio.gather(*(worker(client) for _ in range(WORKERS)))
    return ended


def repeat_hit_rate(ended: list[tuple[int, str, str]]) -> float:
    """Of the cold images' calls after each one's first: those its replica's memory answered."""
    seen: set[int] = set()
    repeats = hits = 0
    for index, outcome, tier in ended:
        if index == 0:
            continue
        if index in seen:
            repeats += 1
            hits += (outcome, tier) == ("hit", "memory")
        seen.add(index)
    return hits / repeats


async def test_bounded_loads_spread_a_hot_image_and_keep_the_others_on_their_replica(
    replicas: Replicas, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """HAProxy hashing x-mmgate-affinity, plain and with hash-balance-factor, each run on images
    of its own: with the factor no replica holds more than the factor of the average of the
    calls in flight (the load the factor bounds; the share of all calls is not bounded with it:
    a replica whose calls are memory hits ends them sooner and takes more); the hot image is
    encoded once per replica at most."""
    ports = [s.port for s in replicas.servers]
    results: dict[str, dict[str, Any]] = {}
    for name, factor, offset in (("plain", None, 7300), ("bounded", BALANCE_FACTOR, 7400)):
        proxy = GrpcHashProxy(
            tmp_path_factory.mktemp(f"haproxy-{name}"), ports, balance_factor=factor
        )
        proxy.start()
        try:
            wait_serving(proxy.target, 60)
            images = [png(offset + i) for i in range(COLD + 1)]
            ended = await hashed_load(proxy.target, images, seed=offset)
            stats = proxy.server_stats()
        finally:
            proxy.stop()
        assert sum(s["stot"] for s in stats.values()) >= CALLS
        hot = [(outcome, tier) for index, outcome, tier in ended if index == 0]
        results[name] = {
            "share": {
                port: s["stot"] / sum(x["stot"] for x in stats.values())
                for port, s in stats.items()
            },
            "most_in_flight": {port: s["smax"] for port, s in stats.items()},
            # each replica's part of the calls' time in flight (calls x their average length):
            # its share of the load over the run
            "load_share": {
                port: s["stot"] * s["ttime"] / sum(x["stot"] * x["ttime"] for x in stats.values())
                for port, s in stats.items()
            },
            "hot_calls": len(hot),
            "hot_encoded": sum(outcome == "miss" and tier == "" for outcome, tier in hot),
            "hot_from_redis": sum(tier == "redis" for _, tier in hot),
            "cold_repeat_memory_hits": repeat_hit_rate(ended),
        }
    bounded, plain = results["bounded"], results["plain"]
    record("bounded_loads", {"factor": BALANCE_FACTOR, "workers": WORKERS, **results})
    # the bound HAProxy keeps: a replica takes a call only below ceil(in flight x factor) / N
    cap = -(-WORKERS * BALANCE_FACTOR // 100) // REPLICAS
    assert max(bounded["most_in_flight"].values()) <= cap, results
    # without the factor the hot image's replica took more than that at once
    assert max(plain["most_in_flight"].values()) > cap, results
    # the hot image: computed once a replica at most, the replicas it spilled to read Redis
    assert 1 <= bounded["hot_encoded"] <= REPLICAS, results
    assert plain["hot_encoded"] == 1, results
    # the cold images' repeats still mostly meet the replica that holds them
    assert bounded["cold_repeat_memory_hits"] >= 0.5, results


FULL_ONLY = pytest.mark.skipif(
    not FULL, reason="make mesh: three replicas, restarted in turn, take minutes (MMGATE_MESH=1)"
)


@FULL_ONLY
async def test_the_replicas_span_has_the_clients_span_as_its_parent(
    replicas: Replicas, proxy: Nginx, otlp: OtlpReceiver
) -> None:
    """The proxy makes no span of its own: the W3C context the client sends reaches the
    replica, whose server span is the client span's child."""
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    async with MmgateClient(proxy.target, timeout=120.0) as client:
        client.metadata = (*client.metadata, ("traceparent", f"00-{trace_id}-{span_id}-01"))
        await ask(client, IMAGES[0])

    def arrived(spans: list[Any]) -> bool:
        return any(s.trace_id == trace_id and s.parent_id == span_id for s in spans)

    spans = await otlp.until(arrived, timeout=60)
    server = next(s for s in spans if s.trace_id == trace_id and s.parent_id == span_id)
    in_trace = [s for s in spans if s.trace_id == trace_id]
    record("tracing", {"server_span": server.name, "spans_in_trace": len(in_trace)})
    assert "Complete" in server.name
    assert any(s.name == "cache.lookup" for s in in_trace)


@FULL_ONLY
async def test_a_rolling_restart_under_load_fails_no_call(
    replicas: Replicas, proxy: Nginx, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each replica in turn: out of the proxy's pool first (what Kubernetes' endpoint removal
    does), then SIGTERM (it drains), started again, back in the pool; the load never stops."""
    mix = Mix(image_ratio=0.5, image_repeat=0.8, working_set=12, max_tokens=24, seed=9)
    workload = Workload(mix)
    # an engine starting while two others serve on the same two cores is slow
    monkeypatch.setattr(support, "START_TIMEOUT", 600.0)
    outcomes: list[Outcome] = []
    stop = asyncio.Event()
    # the load runs while a replica leaves the pool and drains; the replacement's engine then
    # starts with the cores to itself (two cores cannot start an engine beside three serving
    # ones in time), as a surge pod would on a node of its own
    running = asyncio.Event()
    running.set()
    timings: list[dict[str, float]] = []

    async def worker(client: MmgateClient) -> None:
        began = time.perf_counter()
        while not stop.is_set():
            await running.wait()
            outcomes.append(await one(client, workload.next(), began, 120.0))

    async with MmgateClient(proxy.target, timeout=120.0) as client:
        workers = [asyncio.ensure_future(worker(client)) for _ in range(3)]
        for index in range(REPLICAS):
            old = replicas.servers[index]
            before = len(outcomes)
            started = time.monotonic()
            reroute = await wait_reloaded(proxy, proxy.reload(down={old.port}))
            assert await asyncio.to_thread(old.stop) == 0, old.log()
            drained = time.monotonic() - started
            during = len(outcomes) - before
            running.clear()
            new = await asyncio.to_thread(replicas.start, index)
            replicas.servers[index] = new
            proxy.backends[index] = new.port
            await wait_reloaded(proxy, proxy.reload(down=set()))
            running.set()
            timings.append(
                {
                    "out_of_pool_s": round(reroute, 2),
                    "out_and_drained_s": round(drained, 2),
                    "requests_meanwhile": during,
                }
            )
        stop.set()
        await asyncio.gather(*workers)
    codes = Counter(o.code for o in outcomes)
    record("rolling_restart", {"requests": len(outcomes), "codes": dict(codes), "turns": timings})
    assert set(codes) == {"OK"}, codes


@pytest.fixture(scope="module")
def replicas_store(request: pytest.FixtureRequest) -> RedisProcess:
    """The replicas' Redis: the session's (whose Redis the storage tests kill and start again,
    empty), or make mesh's own."""
    store: RedisProcess = request.getfixturevalue("redis" if FULL else "replicas_redis")
    return store


def stored_keys(store: RedisProcess) -> set[str]:
    """The encoder outputs Redis holds, by key."""
    return set(store.cli("--scan", "--pattern", "mmgate:*:embedding:*").split())


@pytest.mark.ends_server
async def test_a_killed_replica_fails_only_its_calls_in_flight(
    replicas: Replicas, proxy: Nginx, replicas_store: RedisProcess
) -> None:
    """SIGKILL one replica a third of the way into a load. Its images go to the others, which
    serve them from Redis without running the encoder; streams it was answering fail
    UNAVAILABLE; unary calls and streams that had not begun are retried by the client."""

    images = iter(range(7300, 7500))

    async def written_back(client: MmgateClient) -> bytes:
        """A new image asked through ``client``, once Redis holds its embedding. A write-back
        is skipped where the image's Redis read timed out (a loaded host) or the replica's
        client has not reconnected yet: another image is asked then, up to ten."""
        for _ in range(10):
            known = stored_keys(replicas_store)
            data = png(next(images))
            await ask(client, data)

            async def stored(known: set[str] = known) -> bool:  # queued, not waited for
                return bool(stored_keys(replicas_store) - known)

            try:
                await eventually(stored, timeout=5)
            except AssertionError:
                continue
            return data
        raise AssertionError("no write-back reached Redis")

    # the storage tests killed this Redis and started it again: a probe image through each
    # replica shows its writes land before the test's own go
    for server in replicas.servers:
        async with server.client(timeout=120.0) as direct:
            await written_back(direct)
    # the images the load asks again once a replica is dead, each one in Redis (an image whose
    # write-back was skipped would be encoded again after the kill)
    async with MmgateClient(proxy.target, timeout=120.0) as client:
        failover = [await written_back(client) for _ in range(12)]
    placement = {i: (await holders(replicas, data)) for i, data in enumerate(failover)}
    load = Counter(h[0] for h in placement.values())
    victim_index = load.most_common(1)[0][0]
    victim = replicas.servers[victim_index]
    orphans = [failover[i] for i, h in placement.items() if h == [victim_index]]
    survivors = [s for s in replicas.servers if s is not victim]
    tier_hits_before = [await tier_hits(s) for s in survivors]
    encodes_before = [await encodes(s) for s in survivors]

    requests = 240 if FULL else 120
    done = 0
    killed = asyncio.Event()
    killed_at = 0.0

    def on_done(outcome: Outcome) -> None:
        nonlocal done, killed_at
        done += 1
        if done == requests // 3 and not killed.is_set():
            # the replica's whole process group, engine core included: what a pod's death is
            # (a SIGKILL of the server alone leaves vLLM's engine core behind, orphaned)
            os.killpg(victim.process.pid, signal.SIGKILL)
            killed_at = time.monotonic()
            killed.set()

    unary: list[tuple[bool, str, str]] = []  # after the kill: (image orphaned, code, tier)

    async def unary_loop(client: MmgateClient) -> None:
        turn = 0
        while not stop.is_set():
            data = failover[turn % len(failover)]
            turn += 1
            try:
                response = await ask(client, data)
                code, tier = "OK", response.final.cache.images[0].tier
            except grpc.aio.AioRpcError as error:  # counted: the figures say which
                code, tier = error.code().name, ""
            if killed.is_set():
                unary.append((data in orphans, code, tier))

    stop = asyncio.Event()
    mix = Mix(image_ratio=0.5, image_repeat=0.8, working_set=12, max_tokens=24, seed=4)
    async with MmgateClient(proxy.target, timeout=120.0) as client:
        looping = asyncio.ensure_future(unary_loop(client))
        outcomes, _, wall = await run(
            client, Workload(mix), Limits(requests=requests, concurrency=6), on_done=on_done
        )
        stop.set()
        await looping
        # after the load: each of the dead replica's images once more, from a survivor
        after = [await ask(client, data) for data in orphans]
    victim.process.wait(timeout=30)

    streams = Counter(o.code for o in outcomes)
    failed_streams = [o for o in outcomes if o.code != "OK"]
    unary_codes = Counter(code for _, code, _ in unary)
    orphan_tiers = Counter(tier for orphan, code, tier in unary if orphan and code == "OK")
    tier_hits_after = [await tier_hits(s) for s in survivors]
    encodes_after = [await encodes(s) for s in survivors]
    figures = {
        "requests": requests,
        "streams": dict(streams),
        "unary_after_kill": dict(unary_codes),
        "orphaned_images": len(orphans),
        "orphan_tiers_after_kill": dict(orphan_tiers),
        "survivor_tier_hits": sum(tier_hits_after) - sum(tier_hits_before),
        "wall_seconds": round(wall, 2),
    }
    record("failover", figures)
    # only streams the dead replica was answering failed: UNAVAILABLE, or INTERNAL where nginx
    # was relaying the stream already (it resets it: RST_STREAM INTERNAL_ERROR, which gRPC
    # reads as INTERNAL; Envoy ends such a stream with UNAVAILABLE trailers). Neither came from
    # mmgate: no failure carries mmgate's ErrorInfo
    assert {o.code for o in failed_streams} <= {"UNAVAILABLE", "INTERNAL"}, figures
    assert all(o.reason == "" for o in failed_streams), figures
    assert len(failed_streams) <= 6, figures  # at most the load's concurrency was in flight
    # every unary call succeeded: those in flight on the dead replica were retried
    assert set(unary_codes) == {"OK"}, figures
    # the dead replica's images came from Redis, not from the encoder
    assert orphans, placement
    assert all(r.final.cache.images[0].tier in ("redis", "memory") for r in after), figures
    assert "redis" in orphan_tiers or any(r.final.cache.images[0].tier == "redis" for r in after)
    assert sum(tier_hits_after) - sum(tier_hits_before) >= len(orphans), figures
    # the survivors encoded no orphan: their encoder ran for the load's own new images only
    new_images = {o.index for o in outcomes if o.kind == "image"}
    assert sum(encodes_after) - sum(encodes_before) <= len(new_images), figures
    assert killed_at > 0


async def tier_hits(server: RunningServer) -> int:
    async with server.client(timeout=30.0) as direct:
        return (await direct.stats()).actor.tier_hits


async def encodes(server: RunningServer) -> int:
    async with server.client(timeout=30.0) as direct:
        return (await direct.stats()).media.encodes
