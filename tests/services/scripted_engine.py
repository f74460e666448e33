"""A scripted engine: the whole server (gRPC, auth, actor, queue, tracing) over no model at all.

It answers every request with the same words, one token each, and counts what it was asked; it
stands in for vLLM where a test (or a benchmark) needs the front end, not generation. Its
tokenizer is a real one (the served folder's), so prompts are rendered and cached for real.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Iterator
from typing import Any

from prometheus_client.core import Metric

from services.config import Settings
from services.engine.dtypes import DtypeChoice
from services.engine.plan import EnginePlan
from services.engine.progress import Progress
from services.engine.stats import Counters, TokenCounters
from services.observability.adapter_metrics import adapter_families
from services.observability.metric_families import engine_families
from services.types import (
    AdapterRef,
    AdapterStats,
    EngineDelta,
    EngineRequest,
    EngineStats,
    EngineTokenStats,
    ModelFacts,
)

WORDS = ("scripted", " answer", " from", " no", " model")


class ScriptedEngine:
    """What ``MmgateServer(engine=ScriptedEngine)`` runs instead of vLLM."""

    max_model_len = 2048
    vocab_size = 256

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.progress = Progress()
        self.plan: EnginePlan | None = None
        self.model_name = ""
        self.requests: list[EngineRequest] = []
        self._tokenizer: Any = None
        self.closed = False
        self._counters = Counters()
        self._tokens = TokenCounters()

    # ── lifecycle ──
    async def start(self, plan: EnginePlan) -> None:
        from transformers import AutoTokenizer

        self.plan = plan
        self.model_name = plan.model.rstrip("/").rsplit("/", 1)[-1]
        self._tokenizer = await asyncio.to_thread(AutoTokenizer.from_pretrained, plan.model)

    async def close(self) -> None:
        self.closed = True

    def dtype_choice(self) -> DtypeChoice:
        return DtypeChoice("float32", "scripted")

    @property
    def ready(self) -> bool:
        return self.plan is not None and not self.closed

    @property
    def failed(self) -> bool:
        return False

    @property
    def stopped(self) -> bool:
        return self.closed

    @property
    def takes_images(self) -> bool:
        return False

    # ── generation ──
    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    def tokenizer_copy(self) -> Any:
        return self._tokenizer

    async def generate(self, request: EngineRequest) -> AsyncGenerator[EngineDelta, None]:
        self.requests.append(request)
        self.progress.opened(request.request_id, "scripted")
        try:
            budget = request.sampling.max_tokens or len(WORDS)
            words = WORDS[:budget]
            for i, word in enumerate(words):
                await asyncio.sleep(0)  # a step: other requests run between tokens
                self.progress.stepped()
                last = i == len(words) - 1
                yield EngineDelta(
                    word,
                    (i + 1,),
                    finish_reason=("length" if budget < len(WORDS) else "stop") if last else None,
                    prompt_tokens=len(request.prompt_token_ids),
                )
        finally:
            self.progress.closed(request.request_id)

    # ── figures, facts, adapters ──
    def stats(self) -> EngineStats:
        return self._counters.snapshot()

    def token_stats(self) -> EngineTokenStats:
        return self._tokens.snapshot()

    def adapter_stats(self) -> AdapterStats:
        return AdapterStats()

    def collect(self) -> Iterator[Metric]:
        yield from engine_families(self.ready, self.stats(), self.token_stats())
        yield from adapter_families(self.adapter_stats())

    def facts(self) -> ModelFacts:
        return ModelFacts(self.vocab_size, (0,), None, has_chat_template=True)

    def adapter(self, name: str) -> AdapterRef:
        raise LookupError(name)

    def served_adapters(self) -> tuple[AdapterRef, ...]:
        return ()

    async def load_adapter(self, name: str, path: str) -> tuple[AdapterRef, bool]:
        raise NotImplementedError

    def unload_adapter(self, name: str) -> int:
        return 0

    async def forget_media(self) -> None:
        pass
