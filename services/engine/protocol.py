"""What mmgate needs of an engine: small Protocols, so a test (or a benchmark) hands in a fake.

``Engine`` is what the pipeline needs to generate; ``ServedEngine`` what the server, its health
monitor, its metrics and its servicers need besides: start from a plan, stats, adapters, close.
``EngineWorker`` (worker.py) is the real one, on vLLM; ``SyntheticEngine`` (synthetic.py) a
load-testing one that runs no model; ``MmgateServer`` takes a factory of them
(``configured_engine`` unless told otherwise: the one the settings name).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Iterator
from typing import Any, Protocol

from prometheus_client.core import Metric

from ..config import Settings
from ..types import (
    AdapterRef,
    AdapterStats,
    EngineDelta,
    EngineRequest,
    EngineStats,
    EngineTokenStats,
    ModelFacts,
)
from .dtypes import DtypeChoice
from .plan import EnginePlan
from .progress import Progress


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


class ServedEngine(Engine, Protocol):
    """An engine as the server runs it: started once from a plan, watched, counted, closed."""

    progress: Progress  # requests open, the last step: what the health monitor watches

    @property
    def failed(self) -> bool: ...

    @property
    def stopped(self) -> bool: ...

    @property
    def takes_images(self) -> bool: ...

    def dtype_choice(self) -> DtypeChoice:
        """The dtype the engine will run in, and why (known before it starts)."""
        ...

    async def start(self, plan: EnginePlan) -> None: ...

    async def close(self) -> None: ...

    def stats(self) -> EngineStats: ...

    def token_stats(self) -> EngineTokenStats: ...

    def collect(self) -> Iterator[Metric]:
        """Its metric families (services/observability/metrics.py)."""
        ...

    def facts(self) -> ModelFacts: ...

    def adapter(self, name: str) -> AdapterRef: ...

    def served_adapters(self) -> tuple[AdapterRef, ...]: ...

    def adapter_stats(self) -> AdapterStats: ...

    async def load_adapter(self, name: str, path: str) -> tuple[AdapterRef, bool]: ...

    def unload_adapter(self, name: str) -> int: ...

    async def forget_media(self) -> None:
        """Drop what the engine keeps of images (its own caches): the next image is new."""
        ...


EngineFactory = Callable[[Settings], ServedEngine]


__all__ = ["Engine", "EngineFactory", "ServedEngine"]
