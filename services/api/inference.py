"""The Inference service: proto in, the pipeline, proto out; and the call's lifecycle.

    GenerateRequest ─▶ admission.enter(tenant): draining? over the server's limit, the tenant's?
        ─▶ deadline (the call's, or the default), taken once and handed down
        ─▶ the pipeline (UNAVAILABLE until the engine has started) ─▶ check_ready ─▶ validate
        ─▶ Request(checked, tenant, deadline, trace headers) ─▶ Pipeline.generate
        ─▶ EngineDelta ... Finished ─▶ TokenDelta ... TokenDelta, GenerateFinal (usage, cache)
                                   or ─▶ CompleteResponse: a Choice per sample (Complete)

Every wait inside a request is bounded by the call's deadline (``context.time_remaining()``, or
``default_deadline_seconds`` when the client set none). Leaving early, by cancellation or deadline,
aborts the engine request. Every failure ends the call with one status (status.py).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict
from collections.abc import AsyncGenerator, Sequence
from typing import final

import grpc
from google.protobuf.internal.containers import RepeatedCompositeFieldContainer
from google.protobuf.message import Message

from ..config import Settings
from ..engine.protocol import ServedEngine
from ..media_types import VideoReport
from ..pipeline.generation import Pipeline, PipelineRef
from ..pipeline.prompts import ToolTemplate
from ..pipeline.request import Request, loop_deadline
from ..proto.mmgate.v1 import inference_pb2 as pb
from ..proto.mmgate.v1 import inference_pb2_grpc
from ..types import (
    EngineDelta,
    Finished,
    ImageReport,
    Logprob,
    LookupReport,
    SampleEnd,
    TokenLogprobs,
    ToolCall,
)
from .adapters import (
    adapter_for,
    adapter_message,
    admin_only,
    usable,
)
from .admission import Admission
from .auth import Caller, current_caller
from .metadata import call_deadline, trace_headers
from .priorities import priority_of, scheduling_message
from .status import abort, answer_too_large, answering
from .validation import MAX_LOGPROBS, validate

# log-probability positions converted into an answer between two turns of the event loop (at
# 20 alternatives each, a few milliseconds of work)
LOGPROB_POSITIONS_A_TURN = 64
_FINISH = {
    "stop": pb.FINISH_REASON_STOP,
    "length": pb.FINISH_REASON_LENGTH,
    "abort": pb.FINISH_REASON_ABORT,
    "tool_calls": pb.FINISH_REASON_TOOL_CALLS,
}


@final
class InferenceServicer(inference_pb2_grpc.InferenceServicer):
    def __init__(
        self,
        settings: Settings,
        pipeline: PipelineRef,
        admission: Admission,
        engine: ServedEngine,
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
                if isinstance(event, Finished):
                    message = await _final_message(event)
                    await self._check_size(message, context)
                else:
                    message = _delta_message(event)
                    if event.logprobs:
                        await _extend_logprobs(message.delta.logprobs, event.logprobs)
                await context.write(message)

    async def Complete(
        self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> pb.CompleteResponse:
        texts: defaultdict[int, list[str]] = defaultdict(list)
        reasonings: defaultdict[int, list[str]] = defaultdict(list)
        choices: dict[int, pb.Choice] = {}  # each in the response already (no copy at the end)
        response = pb.CompleteResponse()

        def choice_for(index: int) -> pb.Choice:
            if index not in choices:
                choices[index] = response.choices.add(index=index)
            return choices[index]

        async with contextlib.aclosing(self._serve(request, context, whole=True)) as events:
            async for event in events:
                if isinstance(event, EngineDelta):
                    choice = choice_for(event.index)
                    texts[event.index].append(event.text)
                    if event.reasoning:
                        reasonings[event.index].append(event.reasoning)
                    choice.token_ids.extend(event.token_ids)
                    await _extend_logprobs(choice.logprobs, event.logprobs)
                else:
                    await _fill_final(response.final, event)
                    for end in event.samples:
                        choice = choice_for(end.index)
                        text = "".join(texts[end.index])
                        # with tools: the text outside the calls
                        # with calls: the text outside them (the parser's content)
                        choice.text = (end.content or "") if end.tool_calls else text
                        choice.reasoning = "".join(reasonings[end.index])
                        choice.end.CopyFrom(_sample_end(end))
        response.choices.sort(key=lambda choice: choice.index)
        if response.choices:
            # the fields of one sample's answer, as before there were several
            response.text = response.choices[0].text
            response.token_ids.extend(response.choices[0].token_ids)
        await self._check_size(response, context)
        return response

    async def _check_size(self, message: Message, context: grpc.aio.ServicerContext) -> None:
        """An answer larger than the server sends is refused in mmgate's words, not gRPC's."""
        size, limit = message.ByteSize(), self.settings.max_send_bytes
        if size > limit:
            await abort(context, answer_too_large(size, limit))

    async def GetModelInfo(
        self, request: pb.GetModelInfoRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelInfo:
        async with answering(context):
            pipeline = self.pipeline.get()
            facts = self.engine.facts()
        settings, caller = self.settings, current_caller()
        return pb.ModelInfo(
            model=self.engine.model_name,
            max_model_len=self.engine.max_model_len,
            vocab_size=facts.vocab_size,
            eos_token_ids=facts.eos_token_ids,
            bos_token_id=facts.bos_token_id,
            takes_images=pipeline.media.takes_images,
            takes_video=pipeline.media.videos.takes_video,
            video_mode=pipeline.media.videos.mode,
            media_mode=pipeline.media.mode,
            has_chat_template=facts.has_chat_template,
            structured_output_backend=facts.structured_output_backend,
            limits=pb.ModelLimits(
                max_tokens=self.engine.max_model_len - 1,
                max_images=settings.media.max_images_per_request,
                max_videos=settings.media.max_videos_per_request,
                max_video_frames=settings.media.max_video_frames,
                max_video_bytes=settings.media.max_video_bytes,
                max_video_seconds=settings.media.max_video_seconds,
                max_video_frame_pixels=settings.media.max_video_frame_pixels,
                min_stream_interval=settings.engine.stream_interval,
                max_message_bytes=settings.max_message_bytes,
                max_stop_strings=settings.max_stop_strings,
                max_stop_token_ids=settings.max_stop_token_ids,
                max_logit_bias=settings.max_logit_bias,
                max_constraint_chars=settings.max_constraint_chars,
                max_choices=settings.max_choices,
                max_samples=settings.max_samples,
                max_logprobs=MAX_LOGPROBS,
                max_tools=settings.max_tools,
                max_tools_chars=settings.max_tools_chars,
                max_tool_calls=settings.max_tool_calls,
            ),
            adapters=usable(caller, self.engine),
            default_adapter=caller.default_adapter,
            scheduling=scheduling_message(settings.tenants.scheduling_of(caller.tenant)),
            tool_template=ToolTemplate(settings.engine.tool_template).resolve(
                facts.template_takes_tools
            ),
            tool_parser=settings.engine.tool_parser,
            reasoning_parser=settings.engine.reasoning_parser,
        )

    async def LoadAdapter(
        self, request: pb.LoadAdapterRequest, context: grpc.aio.ServicerContext
    ) -> pb.LoadAdapterResponse:
        async with answering(context):
            admin_only(current_caller(), "LoadAdapter")
            deadline = call_deadline(context, self.settings.default_deadline_seconds)
            # a load cut short changes nothing mmgate serves (the engine may keep a copy it
            # never uses, until it evicts it)
            async with asyncio.timeout_at(loop_deadline(deadline)):
                ref, replaced = await self.engine.load_adapter(request.name, request.path)
        return pb.LoadAdapterResponse(adapter=adapter_message(ref), replaced=replaced)

    async def UnloadAdapter(
        self, request: pb.UnloadAdapterRequest, context: grpc.aio.ServicerContext
    ) -> pb.UnloadAdapterResponse:
        async with answering(context):
            admin_only(current_caller(), "UnloadAdapter")
            running = self.engine.unload_adapter(request.name)
        return pb.UnloadAdapterResponse(requests_running=running)

    # ── one call ────────────────────────────────────────────────────────────────────────────

    async def _serve(
        self, message: pb.GenerateRequest, context: grpc.aio.ServicerContext, *, whole: bool = False
    ) -> AsyncGenerator[EngineDelta | Finished, None]:
        caller = current_caller()
        finished: Finished | None = None
        async with answering(context):
            with self.admission.enter(caller.tenant, admin=caller.admin):
                deadline = call_deadline(context, self.settings.default_deadline_seconds)
                pipeline = self.pipeline.get()
                async with asyncio.timeout_at(loop_deadline(deadline)):
                    request = self._request(pipeline, message, context, caller, deadline)
                    events = pipeline.generate(request, whole=whole)
                    async with contextlib.aclosing(events):
                        async for event in events:
                            if isinstance(event, Finished):
                                finished = event  # the last event: sent once the call is done
                            else:
                                yield event
        if finished is not None:
            # after the call's admission and engine slots are released: a caller that sends its
            # next request the moment it has this answer is never refused for this one
            yield finished

    def _request(
        self,
        pipeline: Pipeline,
        message: pb.GenerateRequest,
        context: grpc.aio.ServicerContext,
        caller: Caller,
        deadline: float,
    ) -> Request:
        # before any image or video work
        pipeline.check_ready(with_images=bool(message.images), with_videos=bool(message.videos))
        checked = validate(
            message,
            self.settings,
            max_model_len=pipeline.engine.max_model_len,
            vocab_size=pipeline.engine.vocab_size,
            takes_images=pipeline.media.takes_images,
            takes_video=pipeline.media.videos.takes_video,
        )
        adapter = adapter_for(caller, message.adapter, self.engine)
        priority = priority_of(message, self.settings.tenants.scheduling_of(caller.tenant))
        return pipeline.request(
            checked, caller.tenant, deadline, trace_headers(context), adapter, priority
        )


def _delta_message(event: EngineDelta) -> pb.GenerateResponse:
    """A delta's message, its log-probabilities left to add (a message a token: no coroutine)."""
    message = pb.GenerateResponse()
    delta = message.delta
    delta.text = event.text
    delta.token_ids.extend(event.token_ids)
    delta.index = event.index
    if event.reasoning:
        delta.reasoning = event.reasoning
    if event.tool_calls:
        delta.tool_calls.extend(_call(call) for call in event.tool_calls)
    return message


async def _final_message(event: Finished) -> pb.GenerateResponse:
    message = pb.GenerateResponse()
    await _fill_final(message.final, event)
    return message


async def _extend_logprobs(
    field: RepeatedCompositeFieldContainer[pb.TokenLogprobs], positions: Sequence[TokenLogprobs]
) -> None:
    """``positions`` converted into ``field`` a few at a time, the loop free between them: the
    output vLLM merged while the caller was busy (8 samples of 480 positions with 21
    alternatives each) held the loop for seconds when converted at once."""
    for start in range(0, len(positions), LOGPROB_POSITIONS_A_TURN):
        if start:
            await asyncio.sleep(0)
        field.extend(map(_logprobs, positions[start : start + LOGPROB_POSITIONS_A_TURN]))


def _finish(reason: str | None) -> pb.FinishReason:
    return _FINISH.get(reason or "", pb.FINISH_REASON_UNSPECIFIED)


def _logprob(logprob: Logprob) -> pb.Logprob:
    return pb.Logprob(token_id=logprob.token_id, logprob=logprob.logprob, text=logprob.text)


def _logprobs(position: TokenLogprobs) -> pb.TokenLogprobs:
    return pb.TokenLogprobs(token=_logprob(position.token), top=map(_logprob, position.top))


def _sample_end(end: SampleEnd) -> pb.SampleEnd:
    sample = pb.SampleEnd(
        index=end.index,
        finish_reason=_finish(end.finish_reason),
        completion_tokens=end.completion_tokens,
        tool_calls=[_call(call) for call in end.tool_calls],
        tool_parse_error=end.tool_parse_error,
    )
    if isinstance(end.stop_reason, str):
        sample.stop_string = end.stop_reason
    elif isinstance(end.stop_reason, int):
        sample.stop_token_id = end.stop_reason
    return sample


async def _fill_final(final: pb.GenerateFinal, event: Finished) -> None:
    """``final`` made the call's last word, in place: its prompt log-probabilities (as many as
    the context holds) are built once, where the answer keeps them, never copied."""
    head = pb.GenerateFinal(
        finish_reason=_finish(event.finish_reason),
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
            videos=[_video_report(report) for report in event.videos],
        ),
        request_id=event.request_id,
        model=event.model,
        samples=[_sample_end(end) for end in event.samples],
        adapter=adapter_message(event.adapter) if event.adapter is not None else None,
        queue_ms=event.queue_ms,
        priority=event.priority,
    )
    final.CopyFrom(head)
    await _extend_logprobs(final.prompt_logprobs, event.prompt_logprobs)


def _call(call: ToolCall) -> pb.ToolCall:
    return pb.ToolCall(id=call.id, name=call.name, arguments=call.arguments)


def _lookup(report: LookupReport) -> pb.CacheLookup:
    return pb.CacheLookup(
        stage=report.stage,
        key=report.key,
        outcome=report.outcome,
        tier=report.tier,
        wait_ms=report.wait_ms,
        reason=report.reason,
    )


def _video_report(report: VideoReport) -> pb.VideoReport:
    return pb.VideoReport(
        digest=report.digest,
        outcome=report.outcome,
        tier=report.tier,
        form=report.form,
        frames=report.frames,
    )


def _image_report(report: ImageReport) -> pb.ImageReport:
    return pb.ImageReport(
        digest=report.digest, outcome=report.outcome, tier=report.tier, form=report.form
    )


__all__ = ["InferenceServicer"]
