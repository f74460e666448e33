"""The Inference service: validate, go through the cache actor, stream from the engine.

    GenerateRequest ─ validate ─▶ prompt stage (actor flight: render + tokenize, keyed by content)
                                      │ token count checked against max_model_len
                                      ▼
                      image stages (services/media.py: decode, encoder output; actor flights)
                                      ▼
                      response stage (actor flight, only for CACHE_POLICY_RESPONSE and a
                      deterministic request: one engine run shared by identical requests)
                                      │ or straight to the engine
                                      ▼
                      TokenDelta ... TokenDelta, GenerateFinal (usage, cache report)

Every wait inside a request is bounded by the call's deadline (``context.time_remaining()``, or
``default_deadline_seconds`` when the client set none). Leaving early, by cancellation or deadline,
aborts the engine request.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
import uuid
from collections.abc import AsyncGenerator, Mapping
from typing import Any, final

import grpc

from cache_actor import CacheActor, Lookup, Outcome

from .config import Settings
from .engine import EngineDelta, EngineUnavailable, EngineWorker, Sampling
from .errors import ServiceError, abort, from_exception, takes_no_images
from .media import EngineImages, MediaPipeline
from .observers import stage
from .prompts import RenderedPrompt, cache_key, prompt_payload, render
from .proto.mmgate.v1 import inference_pb2 as pb
from .proto.mmgate.v1 import inference_pb2_grpc
from .responses import ResponseRecording
from .validation import GenerationRequest, InvalidRequest, Violation, validate

log = logging.getLogger("mmgate.inference")

TENANT_HEADER = "x-mmgate-tenant"
DEFAULT_TENANT = "default"
_TRACE_HEADERS = ("traceparent", "tracestate")
_FINISH = {
    "stop": pb.FINISH_REASON_STOP,
    "length": pb.FINISH_REASON_LENGTH,
    "abort": pb.FINISH_REASON_ABORT,
}


def metadata_value(context: grpc.aio.ServicerContext, name: str) -> str | None:
    for key, value in context.invocation_metadata() or ():
        if key == name:
            return value if isinstance(value, str) else value.decode()
    return None


def tenant_of(context: grpc.aio.ServicerContext) -> str:
    tenant = metadata_value(context, TENANT_HEADER) or DEFAULT_TENANT
    if len(tenant) > 64 or not tenant.replace("-", "").replace("_", "").isalnum():
        raise InvalidRequest([Violation(TENANT_HEADER, "1 to 64 letters, digits, - and _")])
    return tenant


@final
class InferenceServicer(inference_pb2_grpc.InferenceServicer):
    def __init__(
        self,
        settings: Settings,
        engine: EngineWorker,
        cache: CacheActor[Any],
        media: MediaPipeline | None = None,
    ) -> None:
        self.settings = settings
        self.engine = engine
        self.cache = cache
        # set once the engine has started and the server knows what the model takes
        self.media = media
        self.active = 0
        self.draining = False
        self._idle = asyncio.Event()
        # shared-response producers: they outlive the request that started them
        self._producers: set[asyncio.Task[None]] = set()

    async def Generate(
        self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> None:
        # Written with context.write() and aclosing() rather than by yielding: when the client
        # leaves, the cancellation then closes every generator down to vLLM's at once (its close
        # aborts the engine request), instead of whenever garbage collection finalizes them.
        async with contextlib.aclosing(self._serve(request, context)) as events:
            async for event in events:
                await context.write(event)

    async def Complete(
        self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> pb.CompleteResponse:
        response = pb.CompleteResponse()
        texts: list[str] = []
        async with contextlib.aclosing(self._serve(request, context)) as events:
            async for event in events:
                if event.HasField("delta"):
                    texts.append(event.delta.text)
                    response.token_ids.extend(event.delta.token_ids)
                else:
                    response.final.CopyFrom(event.final)
        response.text = "".join(texts)
        return response

    async def drain(self, grace: float) -> bool:
        """Refuse new requests and wait up to ``grace`` seconds for those in progress.

        Done here rather than by grpc's own grace period, which can end a stream early when
        another call finishes during shutdown (grpc/grpc#37239).
        """
        self.draining = True
        if self.active == 0:
            return True
        self._idle.clear()
        try:
            async with asyncio.timeout(grace):
                await self._idle.wait()
        except TimeoutError:
            return False
        return True

    async def close(self) -> None:
        """Cancel shared-response producers still running (shutdown)."""
        for task in self._producers:
            task.cancel()
        if self._producers:
            await asyncio.wait(set(self._producers), timeout=5)

    # ── one request ─────────────────────────────────────────────────────────────────────────

    async def _serve(
        self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncGenerator[pb.GenerateResponse, None]:
        if self.draining:
            await abort(
                context,
                ServiceError(
                    grpc.StatusCode.UNAVAILABLE, "the server is shutting down", reason="DRAINING"
                ),
            )
        if self.active >= self.settings.max_concurrent_requests:
            await abort(
                context,
                ServiceError(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"{self.active} requests in progress; try again later",
                    reason="OVERLOADED",
                ),
            )
        self.active += 1
        remaining = context.time_remaining()
        deadline = time.monotonic() + (
            self.settings.default_deadline_seconds if remaining is None else remaining
        )
        error: ServiceError | None = None
        try:
            async with (
                asyncio.timeout_at(_loop_time(deadline)),
                contextlib.aclosing(self._generate(request, context, deadline)) as events,
            ):
                async for event in events:
                    yield event
        except Exception as exc:  # noqa: BLE001 - every failure becomes one clear status
            error = from_exception(exc)
        finally:
            self.active -= 1
            if self.active == 0:
                self._idle.set()
        if error is not None:
            await abort(context, error)

    async def _generate(
        self,
        request: pb.GenerateRequest,
        context: grpc.aio.ServicerContext,
        deadline: float,
    ) -> AsyncGenerator[pb.GenerateResponse, None]:
        media = self.media
        if not self.engine.ready or media is None:
            raise EngineUnavailable("the engine is not ready")
        if request.images and media.mode == "none":
            raise takes_no_images(self.engine.model_name)  # before any image work
        checked = validate(
            request,
            self.settings,
            max_model_len=self.engine.max_model_len,
            takes_images=media.mode != "none",
        )
        tenant = tenant_of(context)
        lookups: list[pb.CacheLookup] = []
        prompt = await self._prompt(checked, tenant, deadline, lookups)
        image_tokens = media.encoder.image_tokens if media.encoder is not None else 1
        sampling = self._fit(checked, prompt, len(checked.images) * (image_tokens - 1))
        images: EngineImages | None = None
        image_reports: tuple[pb.ImageReport, ...] = ()
        if checked.images:
            prepared = await media.prepare(checked.images, tenant, _left(deadline))
            images, image_reports = prepared.engine, prepared.reports
        trace_headers = {
            name: value for name in _TRACE_HEADERS if (value := metadata_value(context, name))
        }

        from_cache = False
        if checked.cache_policy == "response" and sampling.deterministic:
            stream, from_cache = await self._shared_response(
                checked, prompt, sampling, tenant, deadline, trace_headers, lookups, images
            )
        else:
            stream = self.engine.generate(
                checked.request_id,
                list(prompt.token_ids),
                sampling,
                trace_headers or None,
                images=images,
            )

        completion_tokens = 0
        prompt_tokens = 0
        last = EngineDelta("", ())
        async with contextlib.aclosing(stream) as deltas:
            async for delta in deltas:
                completion_tokens += len(delta.token_ids)
                prompt_tokens = delta.prompt_tokens or prompt_tokens
                last = delta
                if delta.text or delta.token_ids:
                    yield pb.GenerateResponse(
                        delta=pb.TokenDelta(text=delta.text, token_ids=delta.token_ids)
                    )
        cached_prompt_tokens = 0 if from_cache else last.num_cached_tokens
        yield pb.GenerateResponse(
            final=pb.GenerateFinal(
                finish_reason=_FINISH.get(last.finish_reason or "", pb.FINISH_REASON_UNSPECIFIED),
                usage=pb.Usage(
                    prompt_tokens=prompt_tokens or len(prompt.token_ids),
                    completion_tokens=completion_tokens,
                    cached_prompt_tokens=cached_prompt_tokens,
                ),
                cache=pb.CacheReport(
                    lookups=lookups,
                    cached_prompt_tokens=cached_prompt_tokens,
                    response_from_cache=from_cache,
                    images=image_reports,
                ),
                request_id=checked.request_id,
                model=self.engine.model_name,
            )
        )

    async def _prompt(
        self,
        checked: GenerationRequest,
        tenant: str,
        deadline: float,
        lookups: list[pb.CacheLookup],
    ) -> RenderedPrompt:
        tokenizer = self.engine.tokenizer
        key = cache_key(self.engine.model_name, "prompt", prompt_payload(checked))
        started = time.perf_counter()
        if checked.cache_policy == "bypass":
            rendered = await render(tokenizer, checked)
            lookups.append(_report("prompt", key, None, started))
            return rendered
        with stage("prompt"):
            lookup: Lookup[RenderedPrompt] = await self.cache.get(
                key,
                lambda: render(tokenizer, checked),
                tenant=tenant,
                timeout=_left(deadline),
            )
        lookups.append(_report("prompt", key, lookup, started))
        return lookup.value

    def _fit(
        self, checked: GenerationRequest, prompt: RenderedPrompt, image_tokens: int = 0
    ) -> Sampling:
        """Check the prompt against the context window and settle max_tokens.

        ``image_tokens``: the tokens the engine adds when it expands the image placeholders.
        """
        limit = self.engine.max_model_len
        count = len(prompt.token_ids) + image_tokens
        field = "chat" if checked.chat is not None else "prompt"
        if count >= limit:
            raise InvalidRequest(
                [Violation(field, f"{count} tokens; the model takes at most {limit - 1}")]
            )
        room = limit - count
        if checked.max_tokens_set:
            if checked.sampling.max_tokens > room:
                raise InvalidRequest(
                    [
                        Violation(
                            "sampling.max_tokens",
                            f"{checked.sampling.max_tokens} does not fit: the prompt takes {count}"
                            f" of the model's {limit} tokens",
                        )
                    ]
                )
            return checked.sampling
        return dataclasses.replace(
            checked.sampling, max_tokens=min(room, self.settings.default_max_tokens)
        )

    async def _shared_response(
        self,
        checked: GenerationRequest,
        prompt: RenderedPrompt,
        sampling: Sampling,
        tenant: str,
        deadline: float,
        trace_headers: Mapping[str, str],
        lookups: list[pb.CacheLookup],
        images: EngineImages | None = None,
    ) -> tuple[AsyncGenerator[EngineDelta, None], bool]:
        payload = {
            "prompt": list(prompt.token_ids),
            "sampling": dataclasses.asdict(sampling),
            "images": list(images.uuids) if images is not None else [],
        }
        key = cache_key(self.engine.model_name, "response", payload)

        async def start_recording() -> ResponseRecording:
            recording = ResponseRecording(sampling.max_tokens)
            producer = asyncio.create_task(
                self._record(recording, key, tenant, prompt, sampling, trace_headers, images),
                name=f"mmgate-response-{key[:12]}",
            )
            self._producers.add(producer)
            producer.add_done_callback(self._producers.discard)
            return recording

        started = time.perf_counter()
        with stage("response"):
            lookup: Lookup[ResponseRecording] = await self.cache.get(
                key, start_recording, tenant=tenant, timeout=_left(deadline)
            )
        recording = lookup.value
        report = _report("response", key, lookup, started)
        if lookup.outcome is Outcome.HIT and not recording.done:
            # the stored recording is still being generated: this request joins that run
            report.outcome = Outcome.COALESCED.value
        lookups.append(report)
        return recording.replay(), lookup.outcome is not Outcome.MISS

    async def _record(
        self,
        recording: ResponseRecording,
        key: str,
        tenant: str,
        prompt: RenderedPrompt,
        sampling: Sampling,
        trace_headers: Mapping[str, str],
        images: EngineImages | None,
    ) -> None:
        """Run the engine once for every request sharing this response."""
        error: BaseException | None = None
        try:
            run = self.engine.generate(
                f"shared-{uuid.uuid4().hex}",
                list(prompt.token_ids),
                sampling,
                trace_headers or None,
                images=images,
            )
            async with (
                asyncio.timeout(self.settings.default_deadline_seconds),
                contextlib.aclosing(run) as deltas,
            ):
                async for delta in deltas:
                    recording.append(delta)
        except BaseException as exc:  # noqa: BLE001 - the listeners must learn of any end
            error = exc
        recording.finish(
            error
            if error is None or isinstance(error, Exception)
            else EngineUnavailable("shared response was cancelled")
        )
        if error is not None:
            # a failed run is not an answer: the next identical request generates afresh
            try:
                await self.cache.invalidate(key, tenant=tenant)
            except Exception:
                log.debug("could not drop failed response %s", key[:12], exc_info=True)
            if not isinstance(error, Exception):
                raise error


def _left(deadline: float) -> float:
    return max(0.0, deadline - time.monotonic())


def _loop_time(deadline: float) -> float:
    """A time.monotonic() deadline on the running loop's clock."""
    loop = asyncio.get_running_loop()
    return loop.time() + _left(deadline)


def _report(stage: str, key: str, lookup: Lookup[Any] | None, started: float) -> pb.CacheLookup:
    return pb.CacheLookup(
        stage=stage,
        key=key,
        outcome="bypass" if lookup is None else lookup.outcome.value,
        tier=(lookup.tier or "") if lookup is not None else "",
        wait_ms=(time.perf_counter() - started) * 1000,
    )
