"""mmgate's validated Sampling as vLLM's SamplingParams: the one place the two meet.

A field left unset (None) takes vLLM's default; every field that changes the output is also in
the response-run key (pipeline/responses.py hashes the whole Sampling). mmgate's validation keeps
each value within vLLM's bounds; a bound it does not know (a newer vLLM) is still a caller's
mistake, told as one: INVALID_ARGUMENT naming the field, never an internal error.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from ..errors import InvalidRequest, Violation
from ..types import Constraint, Sampling

if TYPE_CHECKING:
    from vllm.exceptions import VLLMValidationError
    from vllm.sampling_params import SamplingParams

# where a grammar library's message names its own source: "[06:17:34] /project/cpp/x.cc:83: "
_SOURCE_PREFIX = re.compile(r"\[\d\d:\d\d:\d\d\] \S+:\d+: ")

# vLLM's name for each constraint given as text
_VLLM_NAMES = {"json_schema": "json", "regex": "regex", "grammar": "grammar"}

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


def vllm_sampling(sampling: Sampling, *, final_only: bool = False) -> SamplingParams:
    """The engine's parameters for one request, its output streamed as deltas (``final_only``:
    one output when every sample has ended)."""
    # from vLLM's module, not its package: the package's lazy attributes cost an import a call
    from vllm.exceptions import VLLMValidationError
    from vllm.sampling_params import RequestOutputKind, SamplingParams

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
            structured_outputs=_structured(sampling.constraint),
            ignore_eos=sampling.ignore_eos,
            n=sampling.n,
            logprobs=sampling.logprobs,
            prompt_logprobs=sampling.prompt_logprobs,
            output_kind=RequestOutputKind.FINAL_ONLY if final_only else RequestOutputKind.DELTA,
            **optional,
        )
    except VLLMValidationError as refused:
        raise refusal(refused, sampling) from None


def _structured(constraint: Constraint | None) -> Any:
    """vLLM's StructuredOutputsParams for a constraint (a new one per request: vLLM rewrites
    a choice into a grammar in place)."""
    if constraint is None:
        return None
    from vllm.sampling_params import StructuredOutputsParams

    if constraint.kind == "choice":
        return StructuredOutputsParams(choice=list(constraint.choices))
    if constraint.kind == "json_object":
        return StructuredOutputsParams(json_object=True)
    return StructuredOutputsParams(**{_VLLM_NAMES[constraint.kind]: constraint.text})


def refusal(refused: VLLMValidationError, sampling: Sampling) -> InvalidRequest:
    """What the engine refused, in mmgate's words: the field it names (or the constraint, which
    vLLM checks without naming a field), and its reason without a library's source lines."""
    if refused.parameter:
        field = f"sampling.{refused.parameter}"
    elif sampling.constraint is not None:
        field = f"sampling.{sampling.constraint.kind}"
    else:
        field = "sampling"
    reason = _SOURCE_PREFIX.sub("", str(refused.args[0]) if refused.args else "").strip()
    return InvalidRequest([Violation(field, f"the engine refuses it: {reason}")])


__all__ = ["refusal", "vllm_sampling"]
