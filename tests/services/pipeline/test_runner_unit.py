"""The engine runner, alone and under the pipeline, with an engine the test paces: a run's wait in
the queue comes back up as its stream's first event, its slots go back however it ends, and the
wait is reported by the request whose run it was (not by one that joined a shared run)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator

from cache_actor import CacheActor
from services.config import Settings, TenantSettings
from services.pipeline.cache_front import CacheFront
from services.pipeline.chaos import NoChaos
from services.pipeline.generation import Pipeline
from services.pipeline.media import NoImages
from services.pipeline.queue import EngineQueue
from services.pipeline.runner import EngineRunner, QueueWait
from services.types import EngineDelta, EngineRequest, Finished
from tests.services.pipeline.test_shared_response import PacedEngine, shared_request
from tests.support import Clock, until


def waiting(queue: EngineQueue) -> bool:
    """A run of the default tenant waits for a slot (the prompt stage's thread may come first)."""
    figures = queue.stats().tenants.get("default")
    return figures is not None and figures.waiting == 1


def one_slot() -> tuple[EngineRunner, PacedEngine, Clock]:
    engine, clock = PacedEngine(), Clock()
    queue = EngineQueue(1, TenantSettings(newcomer_slots=0), clock)
    return EngineRunner(engine, queue, NoChaos()), engine, clock


def engine_run() -> EngineRequest:
    request = shared_request()
    return request.engine_request((1, 2), request.checked.sampling, None)


async def listed(stream: AsyncIterator[object]) -> list[object]:
    return [event async for event in stream]


async def test_a_run_tells_its_wait_first_then_streams_the_engine_and_frees_its_slot() -> None:
    runner, engine, clock = one_slot()
    engine.go_on.set()
    held = await runner.queue.acquire("other", 0, 1)
    events = asyncio.ensure_future(listed(runner.run(engine_run(), "default")))
    await until(lambda: waiting(runner.queue))
    assert engine.runs == 0  # still waiting: the engine has not seen it
    clock.now += 0.25
    runner.queue.release(held)
    assert await events == [
        QueueWait(0.25),
        EngineDelta("Hello", (1,)),
        EngineDelta(" world", (2,), finish_reason="stop"),
    ]
    assert runner.queue.in_use == 0


async def test_a_run_left_early_gives_its_slot_back() -> None:
    runner, engine, _ = one_slot()
    before_the_engine = runner.run(engine_run(), "default")
    assert await anext(before_the_engine) == QueueWait(0.0)
    assert runner.queue.in_use == 1
    await before_the_engine.aclose()
    assert (runner.queue.in_use, engine.runs) == (0, 0)

    in_the_middle = runner.run(engine_run(), "default")
    await anext(in_the_middle)
    assert await anext(in_the_middle) == EngineDelta("Hello", (1,))
    await in_the_middle.aclose()  # the engine's stream is closed: its request aborted
    assert (runner.queue.in_use, engine.runs) == (0, 1)


async def test_the_request_that_started_a_run_reports_its_wait_and_a_joiner_none() -> None:
    engine = PacedEngine()
    async with CacheActor() as actor:
        cache = CacheFront(lambda: actor)
        pipeline = Pipeline(Settings(), engine, cache, NoImages(engine.model_name))
        clock = pipeline.queue.clock = Clock()
        assert pipeline.queue.slots is not None
        held = await pipeline.queue.acquire("other", 0, pipeline.queue.slots)

        first = pipeline.generate(shared_request())
        started = asyncio.ensure_future(anext(first))
        await until(lambda: waiting(pipeline.queue), limit=1_000_000)
        second = pipeline.generate(shared_request())
        joined = asyncio.ensure_future(anext(second))
        clock.now += 0.25
        pipeline.queue.release(held)
        for head in (await started, await joined):
            assert isinstance(head, EngineDelta)
            assert head.text == "Hello"
        engine.go_on.set()
        first_end = [event async for event in first][-1]
        second_end = [event async for event in second][-1]
        assert isinstance(first_end, Finished)
        assert isinstance(second_end, Finished)
        assert second_end.lookups[-1].outcome == "coalesced"
        assert (first_end.queue_ms, second_end.queue_ms) == (250.0, 0.0)

        # a run of its own (no shared response) reports its wait as well
        held = await pipeline.queue.acquire("other", 0, pipeline.queue.slots)
        private = shared_request()
        private.checked = dataclasses.replace(private.checked, cache_policy="bypass")
        alone = pipeline.generate(private)
        events = asyncio.ensure_future(listed(alone))
        await until(lambda: waiting(pipeline.queue), limit=1_000_000)
        clock.now += 0.5
        pipeline.queue.release(held)
        alone_end = (await events)[-1]
        assert isinstance(alone_end, Finished)
        assert alone_end.queue_ms == 500.0
        assert pipeline.queue.in_use == 0
        await pipeline.close()
