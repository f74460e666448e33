"""The token budget: a prompt checked against the context window, and max_tokens settled.

prompt tokens + image tokens (each placeholder expanded, as the engine will) ─▶ fits?
max_tokens set ─▶ must fit in what is left; unset ─▶ min(what is left, the default), and
                  min_tokens must fit in that
"""

from __future__ import annotations

import dataclasses

from ..errors import InvalidRequest, Violation
from ..types import GenerationRequest, Sampling


def fit(
    checked: GenerationRequest, prompt_tokens: int, max_model_len: int, default_max_tokens: int
) -> Sampling:
    """The request's sampling with max_tokens settled; InvalidRequest when it cannot fit.

    ``prompt_tokens``: the prompt as the engine will run it, image placeholders expanded.
    """
    field = checked.input_field
    if prompt_tokens >= max_model_len:
        raise InvalidRequest(
            [
                Violation(
                    field, f"{prompt_tokens} tokens; the model takes at most {max_model_len - 1}"
                )
            ]
        )
    room = max_model_len - prompt_tokens
    if checked.max_tokens_set:
        if checked.sampling.max_tokens > room:
            raise InvalidRequest(
                [
                    Violation(
                        "sampling.max_tokens",
                        f"{checked.sampling.max_tokens} does not fit: the prompt takes"
                        f" {prompt_tokens} of the model's {max_model_len} tokens",
                    )
                ]
            )
        return checked.sampling
    max_tokens = min(room, default_max_tokens)
    if checked.sampling.min_tokens > max_tokens:
        raise InvalidRequest(
            [
                Violation(
                    "sampling.min_tokens",
                    f"{checked.sampling.min_tokens} is more than the {max_tokens} tokens this"
                    " request may generate; set max_tokens, or ask for fewer",
                )
            ]
        )
    return dataclasses.replace(checked.sampling, max_tokens=max_tokens)


__all__ = ["fit"]
