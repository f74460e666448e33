"""Inference.Tokenize's and Detokenize's inputs, checked as Generate checks the same input."""

from __future__ import annotations

from collections.abc import Sequence

from ..config import Settings
from ..engine.protocol import Engine
from ..errors import InvalidRequest, Violation
from ..proto.mmgate.v1 import inference_pb2 as pb
from ..types import GenerationRequest
from .validation import checked_ids, validate

__all__ = ["checked_token_ids", "tokenize_request"]


def tokenize_request(
    request: pb.TokenizeRequest, settings: Settings, engine: Engine
) -> GenerationRequest:
    """Inference.Tokenize's input, checked as Generate checks a request of that input alone."""
    asked = pb.GenerateRequest()
    if request.HasField("chat"):
        asked.chat.CopyFrom(request.chat)
    elif request.HasField("prompt"):
        asked.prompt = request.prompt
    else:
        raise InvalidRequest([Violation("input", "set prompt or chat")])
    return validate(
        asked, settings, max_model_len=engine.max_model_len, vocab_size=engine.vocab_size
    )


def checked_token_ids(
    given: Sequence[int], field: str, *, max_model_len: int, vocab_size: int
) -> tuple[int, ...]:
    """Token ids a caller sent under ``field`` (Inference.Detokenize's), checked as a tokenized
    prompt's are.

    Raises:
        InvalidRequest: empty, as long as the context, or an id outside the vocabulary.
    """
    problems: list[Violation] = []

    def bad(name: str, description: str) -> None:
        problems.append(Violation(name, description))

    ids = checked_ids(given, field, max_model_len, vocab_size, bad)
    if problems:
        raise InvalidRequest(problems)
    return ids
