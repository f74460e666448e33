"""Engine events as Inference's answers: a delta, the final message, a Complete's choices.

    EngineDelta ─ delta_message ─▶ GenerateResponse(delta)
    Finished ─ final_message / fill_final ─▶ GenerateFinal: usage, cache report, samples' ends

Log-probabilities are converted a few positions at a time (``LOGPROB_POSITIONS_A_TURN``), the
event loop free between: a whole answer's at once held it for seconds.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from google.protobuf.internal.containers import RepeatedCompositeFieldContainer

from ..media_types import VideoReport
from ..proto.mmgate.v1 import inference_pb2 as pb
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
from .adapters import adapter_message

__all__ = ["delta_message", "extend_logprobs", "fill_final", "final_message", "sample_end"]

# log-probability positions converted into an answer between two turns of the event loop (at
# 20 alternatives each, a few milliseconds of work)
LOGPROB_POSITIONS_A_TURN = 64
_FINISH = {
    "stop": pb.FINISH_REASON_STOP,
    "length": pb.FINISH_REASON_LENGTH,
    "abort": pb.FINISH_REASON_ABORT,
    "tool_calls": pb.FINISH_REASON_TOOL_CALLS,
}


def delta_message(event: EngineDelta) -> pb.GenerateResponse:
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


async def final_message(event: Finished) -> pb.GenerateResponse:
    message = pb.GenerateResponse()
    await fill_final(message.final, event)
    return message


async def extend_logprobs(
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


def sample_end(end: SampleEnd) -> pb.SampleEnd:
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


async def fill_final(final: pb.GenerateFinal, event: Finished) -> None:
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
        samples=[sample_end(end) for end in event.samples],
        adapter=adapter_message(event.adapter) if event.adapter is not None else None,
        queue_ms=event.queue_ms,
        priority=event.priority,
    )
    final.CopyFrom(head)
    await extend_logprobs(final.prompt_logprobs, event.prompt_logprobs)


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
