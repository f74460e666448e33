"""Two real mmgate servers (tiny LLaVA, embeddings mode, real vLLM) sharing one real redis-server,
as two replicas do: what one computed the other serves from Redis without computing it, an
invalidation on one reaches the other, bad bytes in Redis are a counted miss, and a Redis killed
in the middle of a load costs no caller anything. The replicas are the session's pair
(tests/replicas.py), which the proxy's smoke test uses too: each test its own images and prompts,
and counts taken as deltas."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import pytest

from services.cli.bench.load import Limits, run
from services.cli.bench.workload import Mix, Workload
from services.client import build_request, digest_of
from services.proto.mmgate.v1 import cache_pb2, inference_pb2
from tests.redis_support import RedisProcess
from tests.replicas import Replicas
from tests.services.prom import scrape
from tests.support import RunningServer, eventually

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest.fixture
def redis(replicas_redis: RedisProcess) -> RedisProcess:
    return replicas_redis


@pytest.fixture
def replicas(shared_replicas: Replicas) -> tuple[RunningServer, RunningServer]:
    return shared_replicas.pair


def image(seed: int) -> bytes:
    return Workload(Mix(image_ratio=1.0, image_repeat=0.0, seed=seed)).next().request.images[0].data


async def ask(server: RunningServer, data: bytes) -> inference_pb2.CompleteResponse:
    async with server.client(timeout=60.0) as client:
        return await client.complete_request(
            build_request("Describe the picture.", images=[data], max_tokens=4)
        )


async def encodes(server: RunningServer) -> float:
    return (await scrape(server.metrics_url)).value("mmgate_media_encodes_total")


async def test_an_image_encoded_by_one_replica_is_a_redis_hit_on_the_other(
    replicas: tuple[RunningServer, RunningServer], redis: RedisProcess
) -> None:
    await image_is_shared(*replicas, seed=1, stored=keys_in(redis))


# the number of keys Redis holds for a stage ("embedding", "response")
StoredKeys = Callable[[str], int]


def keys_in(*nodes: RedisProcess) -> StoredKeys:
    def count(stage: str) -> int:
        pattern = f"mmgate:*:{stage}:*"
        return sum(len(node.cli("--scan", "--pattern", pattern).split()) for node in nodes)

    return count


async def written(stored: StoredKeys, stage: str, before: int) -> None:
    """The first replica's write-back has landed (it is queued, never waited for)."""

    async def landed() -> bool:
        return stored(stage) > before

    await eventually(landed, timeout=10)


async def image_is_shared(
    first: RunningServer, second: RunningServer, seed: int, stored: StoredKeys
) -> None:
    data = image(seed)
    held = stored("embedding")
    answer = await ask(first, data)
    assert answer.final.cache.images[0].tier == ""  # computed here
    await written(stored, "embedding", held)
    before = await encodes(second)
    report = (await ask(second, data)).final.cache.images[0]
    assert report.tier == "redis"
    assert await encodes(second) == before  # the second replica's encoder did not run
    again = (await ask(second, data)).final.cache.images[0]
    assert (again.outcome, again.tier) == ("hit", "memory")


async def test_a_deterministic_response_is_shared_too(
    replicas: tuple[RunningServer, RunningServer], redis: RedisProcess
) -> None:
    await response_is_shared(*replicas, "Name three rivers.", keys_in(redis))


async def response_is_shared(
    first: RunningServer, second: RunningServer, prompt: str, stored: StoredKeys
) -> None:
    async with first.client(timeout=60) as one, second.client(timeout=60) as two:
        request = build_request(prompt, max_tokens=8, temperature=0.0, cache_policy="response")
        held = stored("response")
        made = await one.complete_request(request)
        assert not made.final.cache.response_from_cache
        await written(stored, "response", held)
        served = await two.complete_request(request)
        assert served.final.cache.response_from_cache
    assert served.text == made.text
    assert served.final.usage.completion_tokens == made.final.usage.completion_tokens
    lookups = {(up.stage, up.outcome, up.tier) for up in served.final.cache.lookups}
    assert ("response", "miss", "redis") in lookups
    async with second.client(timeout=60) as two:
        again = await two.complete_request(request)
    lookups = {(up.stage, up.outcome, up.tier) for up in again.final.cache.lookups}
    assert ("response", "hit", "memory") in lookups


async def test_a_seeded_response_of_three_samples_is_replayed_whole_from_memory_and_redis(
    replicas: tuple[RunningServer, RunningServer], redis: RedisProcess
) -> None:
    first, second = replicas
    stored = keys_in(redis)
    request = build_request(
        "Name three lakes.",
        max_tokens=6,
        temperature=1.0,
        seed=77,
        n=3,
        logprobs=2,
        prompt_logprobs=1,
        cache_policy="response",
    )

    def samples(answer: inference_pb2.CompleteResponse) -> list[tuple[object, ...]]:
        return [
            (c.index, c.text, list(c.token_ids), list(c.logprobs), c.end.finish_reason)
            for c in answer.choices
        ]

    async with first.client(timeout=60) as one, second.client(timeout=60) as two:
        held = stored("response")
        made = await one.complete_request(request)
        assert not made.final.cache.response_from_cache
        assert [c.index for c in made.choices] == [0, 1, 2]
        assert all(len(c.logprobs) == len(c.token_ids) > 0 for c in made.choices)
        assert made.final.prompt_logprobs
        await written(stored, "response", held)
        from_redis = await two.complete_request(request)
        from_memory = await two.complete_request(request)
        # streamed from memory too: every sample, indexed, with its logprobs
        streamed: dict[int, list[inference_pb2.TokenLogprobs]] = {0: [], 1: [], 2: []}
        async for event in two.generate(request):
            if event.HasField("delta"):
                streamed[event.delta.index] += event.delta.logprobs
    for answer, tier in ((from_redis, "redis"), (from_memory, "memory")):
        assert answer.final.cache.response_from_cache
        lookups = {(up.stage, up.tier) for up in answer.final.cache.lookups}
        assert ("response", tier) in lookups
        assert samples(answer) == samples(made)
        assert list(answer.final.samples) == list(made.final.samples)
        assert list(answer.final.prompt_logprobs) == list(made.final.prompt_logprobs)
        assert answer.final.usage.completion_tokens == made.final.usage.completion_tokens
    assert streamed == {c.index: list(c.logprobs) for c in made.choices}


async def test_invalidate_on_one_replica_is_a_miss_on_the_other(
    replicas: tuple[RunningServer, RunningServer],
) -> None:
    await invalidate_reaches_the_other(*replicas, seed=2)


async def invalidate_reaches_the_other(
    first: RunningServer, second: RunningServer, seed: int
) -> None:
    data = image(seed)
    await ask(first, data)

    async def held_by_second() -> bool:
        return bool((await ask(second, data)).final.cache.images[0].tier in ("redis", "memory"))

    await eventually(held_by_second, timeout=10)
    async with first.client() as client:
        await client.cache.Invalidate(
            cache_pb2.InvalidateRequest(digest=digest_of(data)), timeout=10
        )

    async def forgotten() -> bool:
        async with second.client() as client:
            answer = await client.cache.Inspect(
                cache_pb2.InspectRequest(digest=digest_of(data)), timeout=10
            )
        return {e.stage: e.state for e in answer.stages}.get("embedding") == "absent"

    await eventually(forgotten, timeout=10)
    before = await encodes(second)
    report = (await ask(second, data)).final.cache.images[0]
    assert (report.outcome, report.tier) == ("miss", "")
    assert await encodes(second) == before + 1


async def test_bad_bytes_in_redis_are_a_counted_miss_and_the_request_succeeds(
    replicas: tuple[RunningServer, RunningServer], redis: RedisProcess
) -> None:
    first, second = replicas
    known = set(redis.cli("--scan", "--pattern", "mmgate:*:embedding:*").split())
    data = image(3)
    await ask(first, data)

    def written() -> set[str]:
        return set(redis.cli("--scan", "--pattern", "mmgate:*:embedding:*").split()) - known

    async def any_written() -> bool:
        return bool(written())

    await eventually(any_written, timeout=10)
    (key,) = written()
    redis.cli("SET", key, "not a value mmgate wrote")
    refused = (await scrape(second.metrics_url)).value("mmgate_tier_refused_values_total")
    before = await encodes(second)
    answer = await ask(second, data)
    assert answer.final.usage.completion_tokens == 4
    assert answer.final.cache.images[0].tier == ""  # computed afresh
    assert await encodes(second) == before + 1
    metrics = await scrape(second.metrics_url)
    assert metrics.value("mmgate_tier_refused_values_total") == refused + 1


async def test_a_response_copied_under_another_prompts_key_is_refused_never_served(
    replicas: tuple[RunningServer, RunningServer], redis: RedisProcess
) -> None:
    first, second = replicas

    def response_keys() -> set[str]:
        return set(redis.cli("--scan", "--pattern", "mmgate:*:response:*").split())

    async def written_by_first(request: inference_pb2.GenerateRequest) -> str:
        known = response_keys()
        async with first.client(timeout=60) as one:
            await one.complete_request(request)

        async def landed() -> bool:
            return bool(response_keys() - known)

        await eventually(landed, timeout=10)
        (key,) = response_keys() - known
        return key

    def shared(prompt: str) -> inference_pb2.GenerateRequest:
        return build_request(prompt, max_tokens=8, temperature=0.0, cache_policy="response")

    source = await written_by_first(shared("Name two mountains."))
    target = await written_by_first(shared("Name two lakes."))
    # a valid value of the same tenant, now under the other prompt's key
    assert redis.cli("COPY", source, target, "REPLACE") == "1"
    refused = (await scrape(second.metrics_url)).value("mmgate_tier_refused_values_total")
    async with second.client(timeout=60) as two:
        answer = await two.complete_request(shared("Name two lakes."))
    assert not answer.final.cache.response_from_cache  # computed afresh
    lookups = {(up.stage, up.outcome, up.tier) for up in answer.final.cache.lookups}
    assert ("response", "miss", "redis") not in lookups
    metrics = await scrape(second.metrics_url)
    assert metrics.value("mmgate_tier_refused_values_total") == refused + 1


async def test_a_stopped_redis_is_timed_out_and_costs_callers_little(
    replicas: tuple[RunningServer, RunningServer], redis: RedisProcess
) -> None:
    _, second = replicas

    async def timed(seeds: range) -> list[float]:
        took = []
        for seed in seeds:  # new images: each a miss that asks Redis first
            started = time.perf_counter()
            answer = await ask(second, image(seed))
            took.append(time.perf_counter() - started)
            assert answer.final.usage.completion_tokens == 4
        return took

    healthy = await timed(range(300, 306))
    read_errors = (await scrape(second.metrics_url)).value(
        "mmgate_actor_tier_errors_total", op="read"
    )
    redis.pause()  # slow, not down: connections stay open, nothing answers
    try:
        stopped = await timed(range(400, 406))
    finally:
        redis.resume()
    metrics = await scrape(second.metrics_url)
    # three timeouts open the breaker (MMGATE_REDIS__BREAKER_FAILURES=3); then Redis is not asked
    assert metrics.value("mmgate_actor_tier_errors_total", op="read") == read_errors + 3
    # each request waited at most one tier timeout (0.25 s) longer than with Redis answering
    assert max(stopped) <= max(healthy) + 0.25 + 0.5, (healthy, stopped)
    print(
        f"\nredis stopped -> 6 requests: slowest {max(stopped) * 1000:.0f} ms, fastest "
        f"{min(stopped) * 1000:.0f} ms (breaker open); with Redis answering: slowest "
        f"{max(healthy) * 1000:.0f} ms; 3 read timeouts"
    )


async def test_a_killed_redis_costs_no_caller_anything(
    replicas: tuple[RunningServer, RunningServer], redis: RedisProcess
) -> None:
    first, second = replicas
    mix = Mix(max_tokens=2, image_ratio=1.0, image_repeat=0.0, working_set=1, seed=40)

    def breaker_closed(server: RunningServer) -> Callable[[], Awaitable[bool]]:
        async def closed() -> bool:  # an earlier test may have left it open for its 2 s
            m = await scrape(server.metrics_url)
            return m.value("mmgate_actor_tier_breaker_open", tier="redis") == 0

        return closed

    def embeddings() -> set[str]:
        return set(redis.cli("--scan", "--pattern", "mmgate:*:embedding:*").split())

    # the first replica computes 24 images; the second then gets them from Redis
    await eventually(breaker_closed(first), timeout=10)
    known = embeddings()
    async with first.client(timeout=60) as one:
        await run(one, Workload(mix), Limits(requests=24, concurrency=4))

    async def written_back() -> bool:  # write-backs are queued, not waited for
        return bool(embeddings() - known)

    await eventually(written_back, timeout=10)
    await eventually(breaker_closed(second), timeout=10)
    async with second.client(timeout=60) as two:
        warm, _, _ = await run(two, Workload(mix), Limits(requests=8, concurrency=4))
        # served from Redis before it dies
        assert "redis" in [tier for o in warm for _, _, tier in o.lookups]
        underway = asyncio.Event()

        def on_done(_: object) -> None:
            underway.set()

        load = asyncio.ensure_future(
            run(two, Workload(mix), Limits(requests=60, concurrency=4, timeout=30), on_done)
        )
        await asyncio.wait_for(underway.wait(), 60)  # Redis dies in the middle of the load
        redis.kill()
        killed = time.monotonic()

        async def open_breaker() -> bool:
            m = await scrape(second.metrics_url)
            return m.value("mmgate_actor_tier_breaker_open", tier="redis") == 1

        await eventually(open_breaker, timeout=20)
        to_open = time.monotonic() - killed
        outcomes, _, _ = await load
        assert {o.code for o in outcomes} == {"OK"}  # no caller saw the outage
        redis.start()

        attempts = iter(range(1000, 2000))

        async def used_again() -> bool:
            # a new image each time: once the breaker closes, its encoder output is written
            await ask(second, image(next(attempts)))
            return redis.cli("DBSIZE") != "0"

        await eventually(used_again, timeout=30, interval=0.1)
    print(f"\nredis killed -> breaker open in {to_open:.2f} s; {len(outcomes)} requests, all OK")


async def test_a_redis_without_a_value_secret_is_warned_of_at_start(
    replicas: tuple[RunningServer, RunningServer],
) -> None:
    """The pair shares a Redis with neither a password nor a value secret: each replica says
    so in its log at start, as docs/security.md's trust table does."""
    for replica in replicas:
        log = replica.log_path.read_text(errors="replace")
        assert "no MMGATE_REDIS__VALUE_SECRET_FILE" in log, replica.log()
        assert "no password in MMGATE_REDIS__URL" in log, replica.log()
