"""What the pipeline needs of an engine: a small Protocol, so tests can hand it a fake.

``EngineWorker`` (worker.py) is the real one, on vLLM; a test's paced engine is another.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any, Protocol

from ..types import EngineDelta, EngineRequest


class Engine(Protocol):
    """Generates token deltas for a tokenized prompt; leaving the stream early aborts it."""

    @property
    def model_name(self) -> str: ...

    @property
    def max_model_len(self) -> int: ...

    @property
    def vocab_size(self) -> int: ...

    @property
    def ready(self) -> bool: ...

    @property
    def tokenizer(self) -> Any: ...

    def tokenizer_copy(self) -> Any:
        """A copy of the tokenizer that one thread may use alone."""
        ...

    def generate(self, request: EngineRequest) -> AsyncGenerator[EngineDelta, None]: ...


__all__ = ["Engine"]
