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
from collections.abc import AsyncGenerator, AsyncIterator
from typing import final

import grpc
from google.protobuf.message import Message

from ..config import Settings
from ..engine.protocol import ServedEngine
from ..errors import InvalidRequest, Violation
from ..pipeline.generation import Pipeline, PipelineRef
from ..pipeline.prompts import ToolTemplate
from ..pipeline.request import Request, loop_deadline
from ..proto.mmgate.v1 import inference_pb2 as pb
from ..proto.mmgate.v1 import inference_pb2_grpc
from ..types import (
    EngineDelta,
    Finished,
)
from .aborts import AnsweredCalls
from .adapters import (
    adapter_for,
    adapter_message,
    admin_only,
    usable,
)
from .admission import Admission
from .auth import Caller, current_caller
from .load import LoadReport, watch_idle
from .metadata import call_deadline, trace_headers
from .priorities import priority_of, scheduling_message
from .replies import delta_message, extend_logprobs, fill_final, final_message, sample_end
from .status import abort, answer_too_large, answering
from .streams import bounded_write, end_without_waiting
from .token_inputs import checked_token_ids, tokenize_request
from .validation import MAX_LOGPROBS, validate

# request ids one Abort may name
MAX_ABORT_IDS = 1024


@final
class InferenceServicer(inference_pb2_grpc.InferenceServicer):
    def __init__(
        self,
        settings: Settings,
        pipeline: PipelineRef,
        admission: Admission,
        engine: ServedEngine,
        load: LoadReport,
    ) -> None:
        self.settings = settings
        self.pipeline = pipeline
        self.admission = admission
        self.engine = engine
        self.load = load
        self.calls = AnsweredCalls()  # what Abort reaches

    async def Generate(
        self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> None:
        # Written with context.write() and aclosing() rather than by yielding: when the client
        # leaves, the cancellation then closes every generator down to vLLM's at once (its close
        # aborts the engine request), instead of whenever garbage collection finalizes them.
        async with (
            answering(context),
            self.calls.answering(current_caller().tenant, request.request_id),
            contextlib.aclosing(self._serve(request, context)) as events,
        ):
            async for event in events:
                if isinstance(event, Finished):
                    message = await final_message(event)
                    await self._check_size(message, context)
                else:
                    message = delta_message(event)
                    if event.logprobs:
                        await extend_logprobs(message.delta.logprobs, event.logprobs)
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

        async with (
            answering(context),
            self.calls.answering(current_caller().tenant, request.request_id),
            contextlib.aclosing(self._serve(request, context, whole=True)) as events,
        ):
            async for event in events:
                if isinstance(event, EngineDelta):
                    choice = choice_for(event.index)
                    texts[event.index].append(event.text)
                    if event.reasoning:
                        reasonings[event.index].append(event.reasoning)
                    choice.token_ids.extend(event.token_ids)
                    await extend_logprobs(choice.logprobs, event.logprobs)
                else:
                    await fill_final(response.final, event)
                    for end in event.samples:
                        choice = choice_for(end.index)
                        text = "".join(texts[end.index])
                        # with tools: the text outside the calls
                        # with calls: the text outside them (the parser's content)
                        choice.text = (end.content or "") if end.tool_calls else text
                        choice.reasoning = "".join(reasonings[end.index])
                        choice.end.CopyFrom(sample_end(end))
        response.choices.sort(key=lambda choice: choice.index)
        if response.choices:
            # the fields of one sample's answer, as before there were several
            response.text = response.choices[0].text
            response.token_ids.extend(response.choices[0].token_ids)
        await self._check_size(response, context)
        return response

    async def Abort(
        self, request: pb.AbortRequest, context: grpc.aio.ServicerContext
    ) -> pb.AbortResponse:
        async with answering(context):
            if len(request.request_ids) > MAX_ABORT_IDS:
                count = len(request.request_ids)
                raise InvalidRequest(
                    [Violation("request_ids", f"{count} ids; the limit is {MAX_ABORT_IDS}")]
                )
            aborted = self.calls.abort(current_caller().tenant, request.request_ids)
        return pb.AbortResponse(aborted=aborted)

    async def Tokenize(
        self, request: pb.TokenizeRequest, context: grpc.aio.ServicerContext
    ) -> pb.TokenizeResponse:
        async with self._admitted(context) as pipeline:
            checked = tokenize_request(request, self.settings, pipeline.engine)
            token_ids = await pipeline.tokenize(checked)
        return pb.TokenizeResponse(token_ids=token_ids, max_model_len=pipeline.engine.max_model_len)

    async def Detokenize(
        self, request: pb.DetokenizeRequest, context: grpc.aio.ServicerContext
    ) -> pb.DetokenizeResponse:
        async with self._admitted(context) as pipeline:
            engine = pipeline.engine
            token_ids = checked_token_ids(
                request.token_ids,
                "token_ids",
                max_model_len=engine.max_model_len,
                vocab_size=engine.vocab_size,
            )
            text = await pipeline.detokenize(token_ids)
        return pb.DetokenizeResponse(text=text)

    @contextlib.asynccontextmanager
    async def _admitted(self, context: grpc.aio.ServicerContext) -> AsyncIterator[Pipeline]:
        """A unary call's work on the pipeline: admitted as a request, under its deadline, its
        failures its status."""
        caller = current_caller()
        async with answering(context):
            with self.admission.enter(caller.tenant, admin=caller.admin):
                deadline = call_deadline(context, self.settings.default_deadline_seconds)
                pipeline = self.pipeline.get()
                pipeline.check_ready(with_images=False)
                async with asyncio.timeout_at(loop_deadline(deadline)):
                    yield pipeline

    async def GetServerInfo(
        self, request: pb.GetServerInfoRequest, context: grpc.aio.ServicerContext
    ) -> pb.ServerInfo:
        return self.load.server_info()

    async def GetLoad(
        self, request: pb.GetLoadRequest, context: grpc.aio.ServicerContext
    ) -> pb.Load:
        return self.load.message(current_caller())

    async def WatchLoad(
        self, request: pb.WatchLoadRequest, context: grpc.aio.ServicerContext
    ) -> None:
        loads = self.load.watch(current_caller(), request.interval_ms)
        idle = self.settings.load.watch_idle_seconds
        async with contextlib.aclosing(loads):
            async with answering(context):
                first = await anext(loads)  # the checks: before anything is sent
            try:
                await bounded_write(context, first, idle)
                async for message in loads:
                    await bounded_write(context, message, idle)
            except TimeoutError:  # a write held that long: the client reads nothing
                end_without_waiting(context, watch_idle(idle))

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


__all__ = ["InferenceServicer"]
