"""/metrics of a real server (`mmgate serve`, real vLLM, loopback gRPC), scraped over HTTP: the
counters move by exactly what the requests did, and promtool finds nothing to say."""

from __future__ import annotations

import uuid

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.client import MmgateClient, build_request
from tests.support import RunningServer

from ..prom import DASHBOARD_NAMES, Scrape, promtool_problems, scrape, scrape_until

COMPLETE = "/mmgate.v1.Inference/Complete"
GENERATE = "/mmgate.v1.Inference/Generate"
WATCH = "/grpc.health.v1.Health/Watch"


def delta(before: Scrape, after: Scrape, name: str, /, **labels: str) -> float:
    return after.value(name, **labels) - before.value(name, **labels)


async def test_a_prompt_miss_then_a_hit(server: RunningServer, client: MmgateClient) -> None:
    before = await scrape(server.metrics_url)
    prompt = f"Metrics {uuid.uuid4().hex}"
    await client.complete(prompt, max_tokens=1, temperature=0.0)
    await client.complete(prompt, max_tokens=1, temperature=0.0)
    after = await scrape(server.metrics_url)

    def moved(name: str, **labels: str) -> float:
        return delta(before, after, name, **labels)

    lookups = "mmgate_actor_lookups_total"
    assert moved(lookups, stage="prompt", outcome="miss", tier="none") == 1
    assert moved(lookups, stage="prompt", outcome="hit", tier="memory") == 1
    assert moved("mmgate_actor_lookup_duration_seconds_count", stage="prompt") == 2
    assert moved("mmgate_grpc_requests_total", method=COMPLETE, code="OK") == 2
    assert moved("mmgate_grpc_request_duration_seconds_count", method=COMPLETE) == 2
    assert after.value("mmgate_grpc_streams_in_flight", method=COMPLETE) == 0
    # a text model: no image went through mmgate's cache
    assert moved("mmgate_cache_media_lookups_total", tier="none", outcome="miss") == 0


async def test_a_bad_request_is_counted_by_its_code(
    server: RunningServer, client: MmgateClient
) -> None:
    before = await scrape(server.metrics_url)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await client.complete("Hi", temperature=-1.0)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    code = "INVALID_ARGUMENT"

    def refused(s: Scrape) -> float:
        return s.value("mmgate_grpc_requests_total", method=COMPLETE, code=code)

    # an abort sends its status before the handler unwinds, and the call is counted as it unwinds:
    # the client may hear the answer a moment before the counter moves
    after = await scrape_until(server.metrics_url, lambda s: refused(s) > refused(before))
    assert delta(before, after, "mmgate_grpc_requests_total", method=COMPLETE, code="OK") == 0
    assert refused(after) - refused(before) == 1
    # refused before the prompt stage: no lookup
    assert after.total("mmgate_actor_lookups_total", stage="prompt") == before.total(
        "mmgate_actor_lookups_total", stage="prompt"
    )


async def test_a_cancelled_stream_is_counted_when_it_ends(server: RunningServer) -> None:
    # a health Watch stays open until its client leaves: in flight for as long as the test likes
    # (a generation on this machine may be over before its first token reaches the client)
    url = server.metrics_url
    before = await scrape(url)
    async with grpc.aio.insecure_channel(server.target) as channel:
        call = health_pb2_grpc.HealthStub(channel).Watch(
            health_pb2.HealthCheckRequest(service=""), timeout=60
        )
        assert (await call.read()).status == health_pb2.HealthCheckResponse.SERVING
        during = await scrape(url)
        assert delta(before, during, "mmgate_grpc_streams_in_flight", method=WATCH) == 1
        call.cancel()

    def ended(s: Scrape) -> float:
        return s.value("mmgate_grpc_requests_total", method=WATCH, code="CANCELLED")

    after = await scrape_until(url, lambda s: ended(s) > ended(before))
    assert ended(after) - ended(before) == 1
    assert delta(before, after, "mmgate_grpc_streams_in_flight", method=WATCH) == 0
    assert delta(before, after, "mmgate_grpc_request_duration_seconds_count", method=WATCH) == 1


async def test_an_expired_deadline_is_counted(server: RunningServer, client: MmgateClient) -> None:
    url = server.metrics_url
    before = await scrape(url)
    request = build_request("Long story", max_tokens=900, ignore_eos=True, temperature=0.0)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        async for _ in client.generate(request, timeout=0.5):
            pass
    assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED

    def expired(s: Scrape) -> float:
        return s.value("mmgate_grpc_requests_total", method=GENERATE, code="DEADLINE_EXCEEDED")

    after = await scrape_until(url, lambda s: expired(s) > expired(before))
    assert expired(after) - expired(before) == 1
    assert after.value("mmgate_grpc_streams_in_flight", method=GENERATE) == 0


async def test_page_and_prefix_levels_and_the_engine(
    server: RunningServer, client: MmgateClient
) -> None:
    url = server.metrics_url
    await client.complete("tick", max_tokens=1)  # an engine step: earlier aborts are counted
    before = await scrape(url)
    # longer than two KV blocks (128 tokens each on CPU): the second run finds them resident
    prompt = f"{uuid.uuid4().hex} " + " ".join(f"word{i}" for i in range(300))
    options = {"raw": True, "max_tokens": 4, "ignore_eos": True, "temperature": 0.0}
    first = await client.complete(prompt, **options)
    second = await client.complete(prompt, **options)
    assert second.final.usage.cached_prompt_tokens > 0, second.final

    def finished(s: Scrape) -> bool:
        return delta(before, s, "mmgate_cache_prefix_requests_total") >= 2

    after = await scrape_until(url, finished)

    def moved(name: str, **labels: str) -> float:
        return delta(before, after, name, **labels)

    prompt_tokens = first.final.usage.prompt_tokens
    assert moved("mmgate_cache_prefix_requests_total") == 2
    assert moved("mmgate_cache_prefix_hit_requests_total") == 1
    assert moved("mmgate_cache_page_queried_tokens_total") >= prompt_tokens
    assert moved("mmgate_cache_page_hit_tokens_total") == second.final.usage.cached_prompt_tokens
    assert moved("mmgate_engine_prompt_tokens_total") == 2 * prompt_tokens
    generated = first.final.usage.completion_tokens + second.final.usage.completion_tokens
    assert moved("mmgate_engine_generation_tokens_total") == generated == 8
    assert moved("mmgate_engine_time_to_first_token_seconds_count") == 2
    assert moved("mmgate_engine_time_to_first_token_seconds_sum") > 0
    for level in ("page", "prefix", "media"):
        assert 0 <= after.value("mmgate_cache_hit_ratio", level=level) <= 1
    page = after.value("mmgate_cache_hit_ratio", level="page")
    assert after.value("vllm_cache_hit_rate") == page
    assert page == pytest.approx(
        after.value("mmgate_cache_page_hit_tokens_total")
        / after.value("mmgate_cache_page_queried_tokens_total")
    )
    assert after.value("mmgate_engine_ready") == 1
    assert after.value("mmgate_engine_running_requests") == 0
    assert 0 <= after.value("mmgate_engine_kv_cache_usage_ratio") <= 1
    assert after.total("mmgate_info", media_mode="none") == 1


async def test_every_series_passes_promtool(server: RunningServer, client: MmgateClient) -> None:
    await client.complete("Hello", max_tokens=1)
    current = await scrape(server.metrics_url)
    assert {name for name in DASHBOARD_NAMES if f"# TYPE {name} " not in current.text} == set()
    assert promtool_problems(current.text) == ""
