"""The Inference service: proto in, the pipeline, proto out; and the call's lifecycle.

    GenerateRequest ─▶ draining? over capacity (the server's, the tenant's share)?
        ─▶ deadline (the call's, or the default)
        ─▶ pipeline.check_ready ─▶ validate ─▶ Request(checked, tenant, deadline, trace headers)
        ─▶ Pipeline.generate ─▶ EngineDelta ... Finished
        ─▶ TokenDelta ... TokenDelta, GenerateFinal (usage, cache report)

Every wait inside a request is bounded by the call's deadline (``context.time_remaining()``, or
``default_deadline_seconds`` when the client set none). Leaving early, by cancellation or deadline,
aborts the engine request. Every failure ends the call with one status (status.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator
from typing import final

import grpc

from ..config import Settings
from ..errors import TenantOverloaded
from ..pipeline.generation import Pipeline
from ..pipeline.request import Request, loop_deadline
from ..proto.mmgate.v1 import inference_pb2 as pb
from ..proto.mmgate.v1 import inference_pb2_grpc
from ..types import EngineDelta, Finished, ImageReport, LookupReport
from .auth import current_caller
from .metadata import trace_headers
from .quotas import TenantQuotas
from .status import ServiceError, abort, draining, from_exception, overloaded
from .validation import validate

_FINISH = {
    "stop": pb.FINISH_REASON_STOP,
    "length": pb.FINISH_REASON_LENGTH,
    "abort": pb.FINISH_REASON_ABORT,
}


@final
class InferenceServicer(inference_pb2_grpc.InferenceServicer):
    def __init__(self, settings: Settings, pipeline: Pipeline, quotas: TenantQuotas) -> None:
        self.settings = settings
        self.pipeline = pipeline
        self.quotas = quotas
        self.active = 0
        # requests in progress by tenant; a tenant leaves the map when its last one ends
        self.active_by_tenant: dict[str, int] = {}
        self.draining = False
        self._idle = asyncio.Event()

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

    # ── one call ────────────────────────────────────────────────────────────────────────────

    async def _serve(
        self, message: pb.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncGenerator[pb.GenerateResponse, None]:
        if self.draining:
            await abort(context, draining())
        if self.active >= self.settings.max_concurrent_requests:
            await abort(context, overloaded(self.active))
        tenant = current_caller().tenant
        held = self.active_by_tenant.get(tenant, 0)
        if held >= self.quotas.concurrent_requests():
            await abort(context, from_exception(TenantOverloaded(tenant, held)))
        self.active += 1
        self.active_by_tenant[tenant] = held + 1
        remaining = context.time_remaining()
        deadline = time.monotonic() + (
            self.settings.default_deadline_seconds if remaining is None else remaining
        )
        error: ServiceError | None = None
        try:
            async with asyncio.timeout_at(loop_deadline(deadline)):
                request = self._request(message, context, tenant, deadline)
                async with contextlib.aclosing(self.pipeline.generate(request)) as events:
                    async for event in events:
                        yield _message(event)
        except Exception as exc:  # noqa: BLE001 - every failure becomes one clear status
            error = from_exception(exc)
        finally:
            self.active -= 1
            left = self.active_by_tenant[tenant] - 1
            if left:
                self.active_by_tenant[tenant] = left
            else:
                del self.active_by_tenant[tenant]
            if self.active == 0:
                self._idle.set()
        if error is not None:
            await abort(context, error)

    def _request(
        self,
        message: pb.GenerateRequest,
        context: grpc.aio.ServicerContext,
        tenant: str,
        deadline: float,
    ) -> Request:
        pipeline = self.pipeline
        pipeline.check_ready(with_images=bool(message.images))  # before any image work
        checked = validate(
            message,
            self.settings,
            max_model_len=pipeline.engine.max_model_len,
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
