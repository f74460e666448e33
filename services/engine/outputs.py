"""The one place that reads vLLM's ``RequestOutput``: into mmgate's ``EngineDelta``.

RequestOutput (DELTA kind) ─▶ EngineDelta: new text and token ids, finish reason once
                              finished, cached prompt tokens, the prompt's length as the
                              engine ran it, and vLLM's timestamps (EngineTimes)
"""

from __future__ import annotations

from typing import Any

from ..types import EngineDelta, EngineTimes


def delta_of(output: Any) -> EngineDelta:
    """One vLLM ``RequestOutput`` of a DELTA-kind request, as the pipeline and spans read it."""
    completion = output.outputs[0]
    return EngineDelta(
        text=completion.text,
        token_ids=tuple(completion.token_ids),
        # finished without a reason vLLM names: "" (the stream still ends there)
        finish_reason=(completion.finish_reason or "") if output.finished else None,
        num_cached_tokens=output.num_cached_tokens or 0,
        prompt_tokens=len(output.prompt_token_ids or ()),
    )


def times_of(output: Any) -> EngineTimes | None:
    """vLLM's timestamps of the request, as its latest output has them (None: not kept)."""
    # vLLM keeps per-request stats unless disable_log_stats; the timestamps are 0 until reached
    metrics = output.metrics
    if metrics is None or not getattr(metrics, "queued_ts", 0.0):
        return None
    return EngineTimes(
        queued=metrics.queued_ts,
        scheduled=metrics.scheduled_ts,
        first_token=metrics.first_token_ts,
        last_token=metrics.last_token_ts,
        preemptions=metrics.num_preemptions,
    )
