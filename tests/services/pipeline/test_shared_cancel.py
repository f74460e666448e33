"""Cancelled shared responses stop in the engine: waves of deterministic CACHE_POLICY_RESPONSE
requests cancelled early never put more requests into the real engine than the concurrency limit
(16 on the test server) admits, and a short request sent meanwhile is served."""

from __future__ import annotations

import asyncio
import uuid

import grpc

from services.client import MmgateClient, build_request
from tests.support import RunningServer, eventually

LIMIT = 16  # MMGATE_MAX_CONCURRENT_REQUESTS of the test server
WAVES = 6
PER_WAVE = 40


async def cancelled_after_first_token(client: MmgateClient, prompt: str) -> None:
    request = build_request(prompt, cache_policy="response", temperature=0.0, max_tokens=600)
    request.sampling.ignore_eos = True
    call = client.inference.Generate(request, timeout=60)
    try:
        async for _ in call:
            break  # the run is going: this caller leaves
    except grpc.aio.AioRpcError as error:
        # over the limit: refused at once, which is the limit at work
        if error.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
            raise
    finally:
        call.cancel()


async def test_cancelled_waves_stay_within_the_limit(server: RunningServer) -> None:
    peak = {"engine": 0, "mmgate": 0}
    sampling = True

    async with server.client(timeout=60.0) as client:

        async def sample() -> None:
            while sampling:
                stats = await client.stats()
                engine, health = stats.engine, stats.engine_health
                peak["engine"] = max(peak["engine"], engine.running + engine.waiting)
                peak["mmgate"] = max(peak["mmgate"], health.in_flight)
                await asyncio.sleep(0.01)  # a sampling rate, not a sequencing wait

        sampler = asyncio.create_task(sample())
        try:
            for wave in range(WAVES):
                prompts = [f"Shared {uuid.uuid4().hex} wave {wave}" for _ in range(PER_WAVE)]
                await asyncio.gather(*(cancelled_after_first_token(client, p) for p in prompts))

            # the last wave's callers have left; their runs end as the server hears it (a busy
            # machine hears later): a slot is free again well before any 600-token run ends
            async def a_slot_free() -> bool:
                return (await client.stats()).engine_health.in_flight < LIMIT

            await eventually(a_slot_free, timeout=20)
            # a short request meanwhile is served (with the bug it waited behind 600-token runs)
            short = await client.complete("Hi", max_tokens=4, timeout=20)
            assert short.final.usage.completion_tokens > 0
        finally:
            sampling = False
            await sampler

        # and nothing is left running once every caller has gone
        async def idle() -> bool:
            stats = await client.stats()
            engine = stats.engine
            return engine.running + engine.waiting == 0 and stats.engine_health.in_flight == 0

        await eventually(idle, timeout=30)
    print(f"\npeak requests: in the engine {peak['engine']}, open in mmgate {peak['mmgate']}")
    assert peak["engine"] <= LIMIT, peak
    assert peak["mmgate"] <= LIMIT, peak
