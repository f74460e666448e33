"""Shared responses in process, with an engine the test paces (the real engine is too fast to
catch in the middle of a run): a request that arrives while the run is going joins it live."""

import asyncio
import time
from collections.abc import AsyncGenerator, Mapping
from typing import Any

from cache_actor import CacheActor
from services.config import Settings
from services.engine import EngineDelta, Sampling
from services.inference import InferenceServicer
from services.prompts import RenderedPrompt
from services.proto.mmgate.v1 import inference_pb2 as pb
from services.validation import GenerationRequest


class PacedEngine:
    """Yields one token, then waits for the test before the rest: a run caught in the middle."""

    model_name = "paced"

    def __init__(self) -> None:
        self.runs = 0
        self.go_on = asyncio.Event()

    async def generate(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        sampling: Sampling,
        trace_headers: Mapping[str, str] | None = None,
        images: object = None,
    ) -> AsyncGenerator[EngineDelta, None]:
        self.runs += 1
        yield EngineDelta("Hello", (1,))
        await self.go_on.wait()
        yield EngineDelta(" world", (2,), finish_reason="stop")


async def test_a_request_joins_a_run_in_the_middle() -> None:
    engine = PacedEngine()
    sampling = Sampling(max_tokens=8, temperature=0.0)
    request = GenerationRequest(
        prompt="hi",
        chat=None,
        sampling=sampling,
        max_tokens_set=True,
        request_id="r",
        cache_policy="response",
    )
    prompt = RenderedPrompt("hi", (5, 6))
    async with CacheActor[Any]() as cache:
        servicer = InferenceServicer(Settings(), engine, cache)  # type: ignore[arg-type]
        deadline = time.monotonic() + 30

        async def share() -> tuple[AsyncGenerator[EngineDelta, None], bool, pb.CacheLookup]:
            lookups: list[pb.CacheLookup] = []
            stream, from_cache = await servicer._shared_response(
                request, prompt, sampling, "default", deadline, {}, lookups
            )
            return stream, from_cache, lookups[0]

        first, first_from_cache, first_lookup = await share()
        assert (await anext(first)).text == "Hello"  # the run is in its middle now
        second, second_from_cache, second_lookup = await share()
        assert (first_lookup.outcome, second_lookup.outcome) == ("miss", "coalesced")
        assert (first_from_cache, second_from_cache) == (False, True)

        engine.go_on.set()
        rest_of_first = [delta.text async for delta in first]
        all_of_second = [delta.text async for delta in second]
        assert rest_of_first == [" world"]
        assert all_of_second == ["Hello", " world"]  # from the start, though it came late
        assert engine.runs == 1

        third, third_from_cache, third_lookup = await share()  # after the run: a replay
        assert [d.text async for d in third] == ["Hello", " world"]
        assert (third_lookup.outcome, third_from_cache) == ("hit", True)
        await servicer.close()
