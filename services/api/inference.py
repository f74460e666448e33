"""The Inference service: proto in, the pipeline, proto out; and the call's lifecycle.

    GenerateRequest ─▶ admission.enter(tenant): draining? over the server's limit, the tenant's?
        ─▶ deadline (the call's, or the default), taken once and handed down
        ─▶ the pipeline (UNAVAILABLE until the engine has started) ─▶ check_ready ─▶ validate
        ─▶ Request(checked, tenant, deadline, trace headers) ─▶ Pipeline.generate
        ─▶ EngineDelta ... Finished ─▶ TokenDelta ... TokenDelta, GenerateFinal (usage, cache)

Every wait inside a request is bounded by the call's deadline (``context.time_remaining()``, or
``default_deadline_seconds`` when the client set none). Leaving early, by cancellation or deadline,
aborts the engine request. Every failure ends the call with one status (status.py).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator
from typing import final

import grpc

from ..config import Settings
from ..engine.worker import EngineWorker
from ..pipeline.generation import Pipeline, PipelineRef
from ..pipeline.request import Request, loop_deadline
from ..proto.mmgate.v1 import inference_pb2 as pb
from ..proto.mmgate.v1 import inference_pb2_grpc
from ..types import EngineDelta, Finished, ImageReport, LookupReport
from .admission import Admission
from .auth import current_caller
from .metadata import call_deadline, trace_headers
from .status import ServiceError, abort, from_exception
from .validation import validate

_FINISH = {
    "stop": pb.FINISH_REASON_STOP,
    "length": pb.FINISH_REASON_LENGTH,
    "abort": pb.FINISH_REASON_ABORT,
}


@final
class InferenceServicer(inference_pb2_grpc.InferenceServicer):
    def __init__(
        self,
        settings: Settings,
        pipeline: PipelineRef,
        admission: Admission,
        engine: EngineWorker,
    ) -> None:
        self.settings = settings
        self.pipeline = pipeline
        self.admission = admission
        self.engine = engine

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

    async def GetModelInfo(
        self, request: pb.GetModelInfoRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelInfo:
        try:
            pipeline = self.pipeline.get()
            facts = self.engine.facts()
        except Exception as exc:  # noqa: BLE001 - every failure becomes one clear status
            await abort(context, from_exception(exc))
        settings = self.settings
        return pb.ModelInfo(
            model=self.engine.model_name,
            max_model_len=self.engine.max_model_len,
            vocab_size=facts.vocab_size,
            eos_token_ids=facts.eos_token_ids,
            bos_token_id=facts.bos_token_id,
            takes_images=pipeline.media.takes_images,
            media_mode=pipeline.media.mode,
            has_chat_template=facts.has_chat_template,
            structured_output_backend=facts.structured_output_backend,
            limits=pb.ModelLimits(
                max_tokens=self.engine.max_model_len - 1,
                max_images=settings.media.max_images_per_request,
                min_stream_interval=settings.engine.stream_interval,
                max_message_bytes=settings.max_message_bytes,
                max_stop_strings=settings.max_stop_strings,
                max_stop_token_ids=settings.max_stop_token_ids,
                max_logit_bias=settings.max_logit_bias,
                max_constraint_chars=settings.max_constraint_chars,
                max_choices=settings.max_choices,
            ),
        )

    # ── one call ────────────────────────────────────────────────────────────────────────────

    async def _serve(
        self, message: pb.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncGenerator[pb.GenerateResponse, None]:
        tenant = current_caller().tenant
        error: ServiceError | None = None
        try:
            with self.admission.enter(tenant):
                deadline = call_deadline(context, self.settings.default_deadline_seconds)
                pipeline = self.pipeline.get()
                async with asyncio.timeout_at(loop_deadline(deadline)):
                    request = self._request(pipeline, message, context, tenant, deadline)
                    async with contextlib.aclosing(pipeline.generate(request)) as events:
                        async for event in events:
                            yield _message(event)
        except Exception as exc:  # noqa: BLE001 - every failure becomes one clear status
            error = from_exception(exc)
        if error is not None:
            await abort(context, error)

    def _request(
        self,
        pipeline: Pipeline,
        message: pb.GenerateRequest,
        context: grpc.aio.ServicerContext,
        tenant: str,
        deadline: float,
    ) -> Request:
        pipeline.check_ready(with_images=bool(message.images))  # before any image work
        checked = validate(
            message,
            self.settings,
            max_model_len=pipeline.engine.max_model_len,
            vocab_size=pipeline.engine.vocab_size,
            takes_images=pipeline.media.takes_images,
        )
        return pipeline.request(checked, tenant, deadline, trace_headers(context))


def _message(event: EngineDelta | Finished) -> pb.GenerateResponse:
    if isinstance(event, EngineDelta):
        return pb.GenerateResponse(delta=pb.TokenDelta(text=event.text, token_ids=event.token_ids))
    return pb.GenerateResponse(
        final=pb.GenerateFinal(
            finish_reason=_FINISH.get(event.finish_reason or "", pb.FINISH_REASON_UNSPECIFIED),
            usage=pb.Usage(
                prompt_tokens=event.prompt_tokens,
                completion_tokens=event.completion_tokens,
                cached_prompt_tokens=event.cached_prompt_tokens,
            ),
            cache=pb.CacheReport(
                lookups=[_lookup(report) for report in event.lookups],
                cached_prompt_tokens=event.cached_prompt_tokens,
                response_from_cache=event.response_from_cache,
                images=[_image_report(report) for report in event.images],
            ),
            request_id=event.request_id,
            model=event.model,
        )
    )


def _lookup(report: LookupReport) -> pb.CacheLookup:
    return pb.CacheLookup(
        stage=report.stage,
        key=report.key,
        outcome=report.outcome,
        tier=report.tier,
        wait_ms=report.wait_ms,
    )


def _image_report(report: ImageReport) -> pb.ImageReport:
    return pb.ImageReport(
        digest=report.digest, outcome=report.outcome, tier=report.tier, form=report.form
    )


__all__ = ["InferenceServicer"]
