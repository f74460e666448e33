"""mmgate's validated Sampling as vLLM's SamplingParams: the one place the two meet.

A field left unset (None) takes vLLM's default; every field that changes the output is also in
the response-run key (pipeline/responses.py hashes the whole Sampling). mmgate's validation keeps
each value within vLLM's bounds; a bound it does not know (a newer vLLM) is still a caller's
mistake, told as one: INVALID_ARGUMENT naming the field, never an internal error.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import InvalidRequest, Violation
from ..types import Sampling

if TYPE_CHECKING:
    from vllm import SamplingParams

# vLLM's name for each optional field, where mmgate's is the same
_OPTIONAL = (
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "min_p",
    "stream_interval",
)


def vllm_sampling(sampling: Sampling) -> SamplingParams:
    """The engine's parameters for one request, its output streamed as deltas."""
    from vllm import SamplingParams
    from vllm.exceptions import VLLMValidationError
    from vllm.sampling_params import RequestOutputKind

    optional = {name: value for name in _OPTIONAL if (value := getattr(sampling, name)) is not None}
    try:
        return SamplingParams(
            max_tokens=sampling.max_tokens,
            min_tokens=sampling.min_tokens,
            stop=list(sampling.stop) or None,
            stop_token_ids=list(sampling.stop_token_ids) or None,
            include_stop_str_in_output=sampling.include_stop_str_in_output,
            skip_special_tokens=sampling.skip_special_tokens,
            logit_bias=dict(sampling.logit_bias) or None,
            ignore_eos=sampling.ignore_eos,
            output_kind=RequestOutputKind.DELTA,
            **optional,
        )
    except VLLMValidationError as refused:
        field = f"sampling.{refused.parameter}" if refused.parameter else "sampling"
        reason = f"the engine refuses it: {refused.args[0]}"
        raise InvalidRequest([Violation(field, reason)]) from None


__all__ = ["vllm_sampling"]
