"""Shared responses through the pipeline, with an engine the test paces (the real engine is too
fast to catch in the middle of a run): a request that arrives while the run is going joins it
live, one that comes after replays it, and the engine runs once for all of them."""

import asyncio
import time
from collections.abc import AsyncGenerator
from typing import Any

import pytest

from cache_actor import CacheActor, InMemoryTier
from services.config import Settings
from services.engine.values import BadValue
from services.pipeline.cache_front import CacheFront
from services.pipeline.generation import Pipeline
from services.pipeline.media import NoImages
from services.pipeline.request import Request
from services.pipeline.responses import ResponseRecording, weight
from services.pipeline.tier_values import ResponseCodec
from services.types import (
    EngineDelta,
    EngineRequest,
    Finished,
    GenerationRequest,
    Logprob,
    Sampling,
    TokenLogprobs,
)
from tests.support import until


class Tokenizer:
    def __call__(self, text: str, **options: Any) -> dict[str, list[int]]:
        return {"input_ids": [ord(c) for c in text]}


class PacedEngine:
    """Yields one token, then waits for the test before the rest: a run caught in the middle."""

    model_name = "paced"
    max_model_len = 64
    vocab_size = 256
    ready = True
    tokenizer = Tokenizer()

    def tokenizer_copy(self) -> Tokenizer:
        return Tokenizer()

    def __init__(self) -> None:
        self.runs = 0
        self.go_on = asyncio.Event()

    async def generate(self, request: EngineRequest) -> AsyncGenerator[EngineDelta, None]:
        self.runs += 1
        yield EngineDelta("Hello", (1,))
        await self.go_on.wait()
        yield EngineDelta(" world", (2,), finish_reason="stop")


def shared_request(stream_interval: int | None = None) -> Request:
    checked = GenerationRequest(
        prompt="hi",
        chat=None,
        sampling=Sampling(max_tokens=8, temperature=0.0, stream_interval=stream_interval),
        max_tokens_set=True,
        request_id="r",
        cache_policy="response",
    )
    return Request(checked, "default", time.monotonic() + 30)


async def test_a_request_streamed_in_other_groups_runs_on_its_own() -> None:
    # the same tokens, but a caller who asked for every token as it comes must not get a run's
    # groups of 4 (or the other way round)
    engine = PacedEngine()
    async with CacheActor() as actor:
        cache = CacheFront(lambda: actor)
        pipeline = Pipeline(Settings(), engine, cache, NoImages(engine.model_name))
        first = pipeline.generate(shared_request())
        assert isinstance(await anext(first), EngineDelta)
        grouped = pipeline.generate(shared_request(stream_interval=4))
        assert isinstance(await anext(grouped), EngineDelta)
        assert engine.runs == 2
        engine.go_on.set()
        for stream in (first, grouped):
            assert isinstance([event async for event in stream][-1], Finished)


async def test_a_request_joins_a_run_in_the_middle() -> None:
    engine = PacedEngine()
    async with CacheActor() as actor:
        cache = CacheFront(lambda: actor)
        pipeline = Pipeline(Settings(), engine, cache, NoImages(engine.model_name))

        first = pipeline.generate(shared_request())
        assert isinstance(delta := await anext(first), EngineDelta)
        assert delta.text == "Hello"  # the run is in its middle now
        second = pipeline.generate(shared_request())
        assert isinstance(joined := await anext(second), EngineDelta)
        assert joined.text == "Hello"  # from the start, though it came late

        engine.go_on.set()
        rest_of_first = [event async for event in first]
        rest_of_second = [event async for event in second]
        assert [e.text for e in rest_of_first if isinstance(e, EngineDelta)] == [" world"]
        assert [e.text for e in rest_of_second if isinstance(e, EngineDelta)] == [" world"]
        first_end, second_end = rest_of_first[-1], rest_of_second[-1]
        assert isinstance(first_end, Finished)
        assert isinstance(second_end, Finished)
        assert [(r.stage, r.outcome) for r in first_end.lookups] == [
            ("prompt", "miss"),
            ("response", "miss"),
        ]
        assert [(r.stage, r.outcome) for r in second_end.lookups] == [
            ("prompt", "hit"),
            ("response", "coalesced"),
        ]
        assert (first_end.response_from_cache, second_end.response_from_cache) == (False, True)
        assert engine.runs == 1

        third = [event async for event in pipeline.generate(shared_request())]  # a replay
        assert [e.text for e in third if isinstance(e, EngineDelta)] == ["Hello", " world"]
        third_end = third[-1]
        assert isinstance(third_end, Finished)
        assert third_end.lookups[-1].outcome == "hit"
        assert third_end.response_from_cache
        assert (third_end.completion_tokens, third_end.finish_reason) == (2, "stop")
        assert engine.runs == 1
        await pipeline.close()


class FailingEngine(PacedEngine):
    """Yields one token, then dies (after the test says so)."""

    async def generate(self, request: EngineRequest) -> AsyncGenerator[EngineDelta, None]:
        self.runs += 1
        yield EngineDelta("Hello", (1,))
        await self.go_on.wait()
        raise RuntimeError("engine died")


async def test_only_a_run_that_finished_normally_reaches_the_second_tier() -> None:
    tier = InMemoryTier("redis")
    engine = PacedEngine()
    async with CacheActor(tier=tier) as actor:
        cache = CacheFront(lambda: actor)
        pipeline = Pipeline(Settings(), engine, cache, NoImages(engine.model_name))
        run = pipeline.generate(shared_request())
        await anext(run)  # the run is in its middle: its recording is in memory, not the tier
        await cache.ping()
        assert tier.values == {}
        engine.go_on.set()
        [event async for event in run]
        await until(lambda: tier.sets == 1)
        ((_, stored),) = tier.values.items()
        assert isinstance(stored, ResponseRecording)
        assert stored.done
        assert stored.error is None
        assert [d.text for d in stored.deltas] == ["Hello", " world"]
        # what another replica reads back: a finished recording, replayed whole
        codec, key = ResponseCodec(), "mmgate:ns:t:response:k"
        again = codec.decode(codec.encode(stored, key), key)
        assert [d.text async for d in again.replay()] == ["Hello", " world"]

    tier = InMemoryTier("redis")
    failing = FailingEngine()
    async with CacheActor(tier=tier) as actor:
        cache = CacheFront(lambda: actor)
        pipeline = Pipeline(Settings(), failing, cache, NoImages(failing.model_name))
        run = pipeline.generate(shared_request())
        await anext(run)
        failing.go_on.set()
        with pytest.raises(RuntimeError):
            [event async for event in run]
        left = pipeline.generate(shared_request())
        await anext(left)
        await left.aclose()  # an abandoned run: aborted
        await cache.ping()
        assert tier.sets == 0  # a failed or aborted run is never written


def test_a_stored_response_keeps_every_sample_and_its_logprobs() -> None:
    def position(token: int, logprob: float) -> TokenLogprobs:
        top = (Logprob(token, logprob, "a"), Logprob(9, -float("inf"), "b"))
        return TokenLogprobs(Logprob(token, logprob, "a"), top)

    deltas = [
        EngineDelta("a", (1,), index=1, logprobs=(position(1, -0.5),),
                    prompt_logprobs=(position(4, -2.0),)),
        EngineDelta("b", (2,), index=0, logprobs=(position(2, -0.25),)),
        EngineDelta("c", (3,), "stop", index=1, stop_reason="c", logprobs=(position(3, 0.0),)),
        EngineDelta("", (), "stop", index=0, stop_reason=7),
    ]  # fmt: skip
    recording = ResponseRecording.finished(deltas)
    codec, key = ResponseCodec(), "mmgate:ns:t:response:k"
    again = codec.decode(codec.encode(recording, key), key)
    assert again.deltas == deltas
    assert again.nbytes == recording.nbytes > 0
    # a sample that did not end is not a response
    with pytest.raises(BadValue, match="did not finish"):
        codec.decode(codec.encode(ResponseRecording.finished(deltas[:3]), key), key)


def test_a_recording_is_weighed_for_every_sample_and_logprob() -> None:
    plain = weight(Sampling(max_tokens=10), 5)
    assert weight(Sampling(max_tokens=10, n=3), 5) == 3 * plain
    assert weight(Sampling(max_tokens=10, logprobs=4), 5) > 5 * plain
    assert weight(Sampling(max_tokens=10, prompt_logprobs=0), 5) > plain
