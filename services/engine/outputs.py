"""The one place that reads vLLM's ``RequestOutput``: into mmgate's ``EngineDelta``.

RequestOutput (DELTA or FINAL_ONLY kind) ─▶ one EngineDelta per sample it carries: new text and
                              token ids (all of them, FINAL_ONLY), their log-probabilities,
                              finish and stop reasons once the sample ended, cached prompt
                              tokens, the prompt's length as the engine ran it and its
                              log-probabilities, and vLLM's timestamps (EngineTimes)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..types import EngineDelta, EngineTimes, Logprob, TokenLogprobs


def deltas_of(output: Any, top: int | None, prompt_top: int | None) -> list[EngineDelta]:
    """One vLLM ``RequestOutput``, a delta per sample in it; ``top``, ``prompt_top``: the
    alternatives the request asked for per output and per prompt token (None: none)."""
    prompt_ids = output.prompt_token_ids or ()
    prompt_logprobs = (
        logprobs_of(prompt_ids[1:], output.prompt_logprobs[1:], prompt_top)
        if prompt_top is not None and output.prompt_logprobs
        else ()
    )
    deltas = []
    for completion in output.outputs:
        token_ids = tuple(completion.token_ids)
        finish = completion.finish_reason
        if finish is None and output.finished and len(output.outputs) == 1:
            finish = ""  # finished without a reason vLLM names (the stream still ends there)
        deltas.append(
            EngineDelta(
                text=completion.text,
                token_ids=token_ids,
                finish_reason=finish,
                num_cached_tokens=output.num_cached_tokens or 0,
                prompt_tokens=len(prompt_ids),
                index=completion.index,
                logprobs=(
                    logprobs_of(token_ids, completion.logprobs, top)
                    if top is not None and completion.logprobs
                    else ()
                ),
                stop_reason=completion.stop_reason if finish else None,
                prompt_logprobs=prompt_logprobs,
            )
        )
        prompt_logprobs = ()  # once per output
    return deltas


def logprobs_of(
    token_ids: Sequence[int], positions: Iterable[Mapping[int, Any] | None], top: int
) -> tuple[TokenLogprobs, ...]:
    """vLLM's per-position dicts (the chosen token, and the ``top`` most likely by rank) as
    mmgate's: the chosen token, then the ``top`` most likely, most likely first."""
    found = []
    for token_id, position in zip(token_ids, positions, strict=False):
        if position is None:
            continue
        ranked = sorted(
            ((tid, entry) for tid, entry in position.items() if 0 < (entry.rank or 0) <= top),
            key=lambda item: item[1].rank,
        )
        chosen = position.get(token_id)
        token = Logprob(
            int(token_id),
            float(chosen.logprob) if chosen is not None else float("-inf"),
            (chosen.decoded_token or "") if chosen is not None else "",
        )
        alternatives = tuple(
            Logprob(int(tid), float(entry.logprob), entry.decoded_token or "")
            for tid, entry in ranked
        )
        found.append(TokenLogprobs(token, alternatives))
    return tuple(found)


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
