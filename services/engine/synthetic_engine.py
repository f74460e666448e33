"""The synthetic engine as mmgate serves it: a ServedEngine over SyntheticLLM (synthetic.py).

    EngineRequest ─▶ vllm_sampling ─▶ SyntheticLLM.generate ─▶ RequestOutput ─▶ deltas_of
        ─▶ EngineDelta: the conversions EngineWorker makes around vLLM's AsyncLLM, so that the
        front end measured over it pays what it pays over vLLM

For load tests only: a server builds it where ``MMGATE_ENGINE__SYNTHETIC`` is set
(factory.configured_engine), and says so in its log at start.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
from collections.abc import AsyncGenerator, Iterator
from typing import Any, final

from prometheus_client.core import Metric

from ..config import Settings, SyntheticSettings
from ..errors import AdapterNotFound, AdapterRefused, EngineUnavailable
from ..observability.adapter_metrics import adapter_families
from ..observability.metric_families import engine_families
from ..types import (
    AdapterRef,
    AdapterStats,
    EngineDelta,
    EngineRequest,
    EngineStats,
    EngineTokenStats,
    ModelFacts,
)
from .adapter_files import NO_ADAPTER_ROOT
from .dtypes import DtypeChoice
from .outputs import deltas_of
from .plan import EnginePlan
from .progress import Progress
from .sampling import vllm_sampling
from .stats import Counters, TokenCounters
from .synthetic import SyntheticLLM
from .tools import template_takes_tools

log = logging.getLogger("mmgate.engine")


@final
class SyntheticEngine:
    """mmgate's ServedEngine over SyntheticLLM, timed by ``settings.engine.synthetic``."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings.engine
        self.timing = settings.engine.synthetic or SyntheticSettings()
        self.progress = Progress()
        self.plan: EnginePlan | None = None
        self.model_name = ""
        self.max_model_len = self.settings.max_model_len
        self.vocab_size = 0
        self.llm: SyntheticLLM | None = None
        self._tokenizer: Any = None
        self._closed = False
        self._counters = Counters()
        self._tokens = TokenCounters()

    # ── lifecycle ──
    async def start(self, plan: EnginePlan) -> None:
        from transformers import AutoTokenizer

        if self.plan is not None:
            raise RuntimeError("the engine has started already")
        log.warning("a synthetic engine serves (engine.synthetic): no model runs, load tests only")
        self.plan = plan
        self.model_name = (
            self.settings.served_model_name or plan.model.rstrip("/").rsplit("/", 1)[-1]
        )
        self._tokenizer = await asyncio.to_thread(AutoTokenizer.from_pretrained, plan.model)
        # vLLM's types (SamplingParams, RequestOutput) imported now, off the loop: seconds
        await asyncio.to_thread(importlib.import_module, "vllm.outputs")
        self.vocab_size = len(self._tokenizer)
        self.llm = SyntheticLLM(
            self.timing,
            self._tokenizer,
            max_num_seqs=self.settings.max_num_seqs,
            stream_interval=self.settings.stream_interval,
            on_step=self._stepped,
        )

    def _stepped(self, running: int, waiting: int, made: int) -> None:
        self.progress.stepped()
        self._counters.running, self._counters.waiting = running, waiting
        self._tokens.add(0, made, [])

    async def close(self) -> None:
        self._closed = True
        if self.llm is not None:
            await self.llm.close()

    def dtype_choice(self) -> DtypeChoice:
        return DtypeChoice("synthetic", "a synthetic engine: no model runs")

    @property
    def ready(self) -> bool:
        return self.llm is not None and not self._closed

    @property
    def failed(self) -> bool:
        return False

    @property
    def stopped(self) -> bool:
        return self._closed

    @property
    def takes_images(self) -> bool:
        return False

    # ── generation ──
    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    def tokenizer_copy(self) -> Any:
        from .tokenizers import private_copy

        return private_copy(self._tokenizer)

    def _require(self) -> SyntheticLLM:
        if self.llm is None or self._closed:
            raise EngineUnavailable("the engine is not running")
        return self.llm

    async def generate(self, request: EngineRequest) -> AsyncGenerator[EngineDelta, None]:
        """As EngineWorker.generate: vLLM's parameters in, its outputs converted out."""
        llm = self._require()
        if request.adapter is not None:
            raise AdapterNotFound(request.adapter.name)
        sampling = request.sampling
        params = vllm_sampling(sampling, final_only=request.final_only)
        outputs = llm.generate(
            {"prompt_token_ids": list(request.prompt_token_ids)}, params, request.request_id
        )
        self.progress.opened(request.request_id, request.label)
        finished = False
        try:
            async with contextlib.aclosing(outputs):
                async for output in outputs:
                    finished = output.finished
                    for delta in deltas_of(output, sampling.logprobs, sampling.prompt_logprobs):
                        yield delta
        finally:
            self.progress.closed(request.request_id)
            if finished:
                self._counters.requests += 1
                self._tokens.add(len(request.prompt_token_ids), 0, [])
            else:
                self._counters.aborted += 1

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
        tokenizer = self._tokenizer
        return ModelFacts(
            vocab_size=self.vocab_size,
            eos_token_ids=(int(tokenizer.eos_token_id),)
            if tokenizer.eos_token_id is not None
            else (),
            bos_token_id=tokenizer.bos_token_id,
            has_chat_template=getattr(tokenizer, "chat_template", None) is not None,
            template_takes_tools=template_takes_tools(getattr(tokenizer, "chat_template", None)),
        )

    def adapter(self, name: str) -> AdapterRef:
        raise AdapterNotFound(name)

    def served_adapters(self) -> tuple[AdapterRef, ...]:
        return ()

    async def load_adapter(self, name: str, path: str) -> tuple[AdapterRef, bool]:
        raise AdapterRefused("path", NO_ADAPTER_ROOT)

    def unload_adapter(self, name: str) -> int:
        raise AdapterNotFound(name)

    async def forget_media(self) -> None:
        pass


__all__ = ["SyntheticEngine"]
