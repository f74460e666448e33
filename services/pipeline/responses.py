"""Shared responses: one engine run streamed to every identical deterministic request.

    first request ──▶ cache flight ──▶ ResponseRecording + producer task ◀── runner.run(run)
                  ◀── recording.replay_with_wait(): the run's wait in the queue, then replay()
    joiners, later hits ──────────────▶ recording.replay(): what is there, then what arrives

The recording is what the cache stores: a request that joins while the answer is being generated
streams it live, and one that comes later replays it whole. The producer belongs to no single
request (it outlives the one that started it, under its own deadline), but it runs only while
someone listens: it starts the engine when its first listener arrives, and when the last one
leaves before the end, the run is aborted and the leaver waits for that. Every engine run then
has a caller counted in the concurrency limit: no run goes on in the engine for callers who have
all left, unseen by the limit. A failed or abandoned run is dropped from the
cache so the next request generates afresh. The producer runs the engine through the runner
(runner.py), as a request's own run does; the run's wait in the queue is reported by the request
that started it, and by none that joined or replayed it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncGenerator
from typing import final

from cache_actor import Lookup, Outcome, Stage

from ..errors import EngineUnavailable
from ..keys import cache_key
from ..media_types import EngineVideos
from ..types import EngineDelta, EngineImages, EngineRequest, RenderedPrompt, Sampling
from .cache_front import CacheFront
from .request import Request
from .runner import EngineRunner, QueueWait

log = logging.getLogger("mmgate.responses")

# Bytes a streamed token costs in a recording (id, text, bookkeeping): the weight admitted up front.
BYTES_PER_TOKEN = 64
# Bytes one log-probability costs (a token id, a float, a token's text, the object around them)
BYTES_PER_LOGPROB = 160
# A producer whose first listener does not come in this long (its caller left during the lookup)
# never starts the engine.
FIRST_LISTENER_SECONDS = 5.0
# How long the last listener to leave waits for the aborted run to end.
ABORT_WAIT_SECONDS = 5.0


def weight(sampling: Sampling, prompt_tokens: int) -> int:
    """What a run's recording may grow to: every sample's tokens, with their log-probabilities
    and the prompt's when asked."""
    per_token = BYTES_PER_TOKEN
    if sampling.logprobs is not None:
        per_token += BYTES_PER_LOGPROB * (1 + sampling.logprobs)
    nbytes = per_token * sampling.max_tokens * sampling.n
    if sampling.prompt_logprobs is not None:
        nbytes += BYTES_PER_LOGPROB * (1 + sampling.prompt_logprobs) * prompt_tokens
    return nbytes


def _weighed(delta: EngineDelta) -> int:
    logprobs = sum(1 + len(p.top) for p in (*delta.logprobs, *delta.prompt_logprobs))
    return BYTES_PER_TOKEN * len(delta.token_ids) + BYTES_PER_LOGPROB * logprobs


@final
class ResponseRecording:
    def __init__(self, nbytes: int) -> None:
        self.deltas: list[EngineDelta] = []
        self.error: BaseException | None = None
        self.done = False
        # admitted to the cache before it is complete: weigh what it may grow to (weight())
        self.nbytes = nbytes
        self._changed = asyncio.Event()
        self.listeners = 0
        self.listened = asyncio.Event()  # the first listener has come
        # every listener left before the end: the run is being aborted, nobody may join it
        self.abandoned = False
        self.producer: asyncio.Task[None] | None = None
        # the run's wait for its engine slots, once granted: the starter's to report
        self.queued: QueueWait | None = None

    @classmethod
    def finished(cls, deltas: list[EngineDelta]) -> ResponseRecording:
        """A run that ended normally elsewhere (another replica, read from the second tier)."""
        recording = cls(0)
        recording.deltas = deltas
        recording.nbytes = sum(map(_weighed, deltas))
        recording.done = True
        return recording

    def append(self, delta: EngineDelta) -> None:
        self.deltas.append(delta)
        self._notify()

    def finish(self, error: BaseException | None = None) -> None:
        self.error = error
        self.done = True
        self._notify()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def replay(self) -> AsyncGenerator[EngineDelta, None]:
        """Every delta from the first; waits for new ones until the run ends."""
        self.listeners += 1
        self.listened.set()
        try:
            index = 0
            while True:
                while index < len(self.deltas):
                    yield self.deltas[index]
                    index += 1
                if self.done:
                    if self.error is not None:
                        raise self.error
                    return
                # bounded by the caller's deadline and by the producer's own (it always ends)
                await self._changed.wait()
        finally:
            self.listeners -= 1
            if self.listeners == 0 and not self.done:
                await self._abandon()

    async def replay_with_wait(self) -> AsyncGenerator[QueueWait | EngineDelta, None]:
        """replay(), led by the run's wait in the queue (before its first delta): how the
        request that started the run sees it."""
        told = False
        async with contextlib.aclosing(self.replay()) as deltas:
            async for delta in deltas:
                if not told and self.queued is not None:
                    told = True
                    yield self.queued
                yield delta
        if not told and self.queued is not None:
            yield self.queued  # a run that ended without a delta

    async def _abandon(self) -> None:
        """The last listener left mid-run: abort it, and wait (bounded) until it has ended."""
        self.abandoned = True
        producer = self.producer
        if producer is None or producer.done():
            return
        producer.cancel()
        # shielded: a second cancellation of the leaver must not cut the wait short and let
        # it leave the limit while its run is still in the engine
        with contextlib.suppress(TimeoutError, asyncio.CancelledError):
            await asyncio.wait_for(asyncio.shield(asyncio.wait({producer})), ABORT_WAIT_SECONDS)


@final
class SharedResponses:
    """The response stage: identical deterministic requests share one engine run."""

    def __init__(self, runner: EngineRunner, cache: CacheFront, run_deadline: float) -> None:
        self.runner = runner
        self.cache = cache
        # a producer's own bound: it serves whoever joins, not one caller's deadline
        self.run_deadline = run_deadline
        self._producers: set[asyncio.Task[None]] = set()

    async def share(
        self,
        request: Request,
        prompt: RenderedPrompt,
        sampling: Sampling,
        images: EngineImages | None,
        videos: EngineVideos | None = None,
    ) -> tuple[AsyncGenerator[QueueWait | EngineDelta, None], bool]:
        """The run's deltas for this request, and whether they came from the cache; led by the
        run's wait in the queue for the request that started it."""
        payload = {
            "prompt": list(prompt.token_ids),
            "sampling": dataclasses.asdict(sampling),
            "images": list(images.uuids) if images is not None else [],
        }
        if videos is not None:
            payload["videos"] = list(videos.uuids)
        if request.adapter is not None:
            # by content: an adapter reloaded under its name with other weights answers anew
            payload["adapter"] = request.adapter.digest
        tools = request.checked.tools
        if tools is not None:
            # the tools are in the prompt already; the choice is how the answer is read
            payload["tool_choice"] = [tools.choice, tools.function, tools.parallel]
        key = cache_key(self.runner.model_name, Stage.RESPONSE, payload)
        run = request.engine_request(prompt.token_ids, sampling, images, videos)
        tenant = request.tenant

        async def start_recording() -> ResponseRecording:
            recording = ResponseRecording(weight(sampling, len(prompt.token_ids)))
            producer = asyncio.create_task(
                self._record(recording, key, tenant, run), name=f"mmgate-response-{key[:12]}"
            )
            recording.producer = producer
            self._producers.add(producer)
            producer.add_done_callback(self._producers.discard)
            return recording

        async def look_up() -> Lookup[ResponseRecording]:
            return await self.cache.get(
                key,
                start_recording,
                tenant=tenant,
                timeout=request.left(),
                tier=Stage.RESPONSE.tier_use,
            )

        started = time.perf_counter()
        lookup = await look_up()
        recording = lookup.value
        if recording.abandoned:
            # its run is being aborted (its listeners all left): not one to join
            await self.cache.invalidate(key, tenant=tenant, local=True)
            lookup = await look_up()
            recording = lookup.value
        # a stored recording still being generated: this request joins that run
        joined = lookup.outcome is Outcome.HIT and not recording.done
        request.report(
            Stage.RESPONSE, key, lookup, started, Outcome.COALESCED.value if joined else None
        )
        # from the cache: memory, a run joined, or one another replica finished (the second tier)
        generated_here = lookup.outcome is Outcome.MISS and lookup.tier is None
        if generated_here:
            # this request started the run: its wait in the queue is this request's
            return recording.replay_with_wait(), False
        return recording.replay(), True

    async def close(self) -> None:
        """Cancel the producers still running (shutdown)."""
        for task in self._producers:
            task.cancel()
        if self._producers:
            await asyncio.wait(set(self._producers), timeout=5)

    async def _record(
        self, recording: ResponseRecording, key: str, tenant: str, run: EngineRequest
    ) -> None:
        """Run the engine once for every request sharing this response (its wait in the queue
        is the starter's: replay_with_wait)."""
        error: BaseException | None = None
        try:
            # no listener, no engine run: the caller may have left during the lookup
            async with asyncio.timeout(FIRST_LISTENER_SECONDS):
                await recording.listened.wait()
            stream = self.runner.run(run, tenant)
            async with asyncio.timeout(self.run_deadline), contextlib.aclosing(stream) as events:
                async for event in events:
                    if isinstance(event, QueueWait):
                        recording.queued = event
                    else:
                        recording.append(event)
        except BaseException as exc:  # noqa: BLE001 - the listeners must learn of any end
            error = exc
        recording.finish(
            error
            if error is None or isinstance(error, Exception)
            else EngineUnavailable("shared response was cancelled")
        )
        if error is None:
            # only a run that finished normally is an answer for the other replicas
            self.cache.put(key, recording, tenant=tenant, stage=Stage.RESPONSE)
        else:
            # a failed run is not an answer: the next identical request generates afresh
            try:
                # this replica's copy only: a failed run never reached the second tier
                await self.cache.invalidate(key, tenant=tenant, local=True)
            except Exception:
                log.debug("could not drop failed response %s", key[:12], exc_info=True)
            if not isinstance(error, Exception):
                raise error


__all__ = [
    "ABORT_WAIT_SECONDS",
    "BYTES_PER_LOGPROB",
    "BYTES_PER_TOKEN",
    "FIRST_LISTENER_SECONDS",
    "ResponseRecording",
    "SharedResponses",
    "weight",
]
