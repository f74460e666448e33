"""A synthetic engine for load tests: a GPU's continuous batching at next to no CPU.

    SyntheticLLM.generate(prompt, SamplingParams, request_id) ─▶ RequestOutput, as AsyncLLM
        one clock for all requests: every ``step_seconds`` each running request (``max_num_seqs``
        at once, the rest wait in order) gets one token; a request starts after a prefill of
        ``prefill_seconds_per_token`` a prompt token; a late clock catches up (several tokens a
        request at once), so the rate is the engine's whatever the front end's loop does
        outputs merged for a consumer that falls behind, as vLLM's output collector does;
        one output every ``stream_interval`` tokens (the first and the last at once)
    SyntheticEngine: mmgate's ServedEngine over it, converting as EngineWorker converts
        AsyncLLM's outputs (vllm_sampling in, deltas_of out)

The tokens are a fixed passage's, tokenized once by the served model's own tokenizer, its text
cut at the tokenizer's offsets: detokenized text at no cost per token. A request's answer starts
in the passage where its prompt says (the same prompt, the same answer) and ends with the
model's end-of-sequence token after ``answer_tokens`` unless ``ignore_eos``; ``max_tokens`` and
``min_tokens`` act as in vLLM. Stop strings, stop token ids, log-probabilities, constraints and
adapters are not modelled: a request is answered as if it had none.

A load-testing engine, never a default: a server runs it only where its settings name it
(``MMGATE_ENGINE__SYNTHETIC``: bench/frontend.py, the tests of the front end), and says so in its
log at start; SyntheticLLM alone stands in for vLLM's own servers (bench/synthetic_vllm.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
from collections import deque
from collections.abc import AsyncGenerator, Callable, Iterable, Iterator
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

log = logging.getLogger("mmgate.engine")

PASSAGE = (
    "The harbour was quiet before dawn. Fishing boats rocked against the stone quay, their "
    "lamps still lit, and a cat walked the length of the sea wall as if it owned the town. "
    "Somewhere a radio played an old song about rivers and trains. The baker opened his "
    "shutters, the smell of bread reached the water, and the first gulls answered. By six the "
    "market had filled with crates of lemons, nets, coils of rope and people who had known each "
    "other all their lives. Nobody hurried. The tide would turn at nine, the ferry would leave "
    "at ten, and whatever the day brought would be talked over at the café by noon. "
)


@final
class Passage:
    """A fixed text as the model's tokens, and each token's piece of the text."""

    __slots__ = ("eos", "ids", "pieces")

    def __init__(self, tokenizer: Any) -> None:
        encoded = tokenizer(PASSAGE, add_special_tokens=False, return_offsets_mapping=True)
        self.ids: tuple[int, ...] = tuple(int(i) for i in encoded["input_ids"])
        ends = [end for _, end in encoded["offset_mapping"]]
        starts = [0, *ends[:-1]]
        self.pieces: tuple[str, ...] = tuple(
            PASSAGE[a:b] for a, b in zip(starts, ends, strict=True)
        )
        eos = tokenizer.eos_token_id
        self.eos: int = int(eos) if eos is not None else self.ids[-1]

    def tokens(self, offset: int, start: int, stop: int, eos_at: int) -> tuple[list[int], str]:
        """Positions ``start`` to ``stop`` of an answer that starts at ``offset`` in the passage
        and has its end-of-sequence token at ``eos_at`` (text without it, as vLLM skips it)."""
        ids: list[int] = []
        pieces: list[str] = []
        size = len(self.ids)
        for position in range(start, stop):
            if position == eos_at:
                ids.append(self.eos)
                continue
            at = (offset + position) % size
            ids.append(self.ids[at])
            pieces.append(self.pieces[at])
        return ids, "".join(pieces)


@final
class _Run:
    """One request in the synthetic batch: what the clock has made, and what was handed out."""

    __slots__ = (
        "eos_at",
        "event",
        "finish",
        "made",
        "offset",
        "output_kind",
        "prompt_ids",
        "ready_at",
        "request_id",
        "samples",
        "taken",
        "text",
        "total",
        "unsent",
    )

    def __init__(
        self, request_id: str, prompt_ids: list[int], params: Any, timing: SyntheticSettings
    ) -> None:
        from vllm.sampling_params import RequestOutputKind

        self.request_id = request_id
        self.prompt_ids = prompt_ids
        self.samples = max(1, int(params.n or 1))
        self.text = params.detokenize
        self.output_kind = params.output_kind
        budget = int(params.max_tokens if params.max_tokens is not None else timing.answer_tokens)
        self.eos_at = -1 if params.ignore_eos else max(timing.answer_tokens, params.min_tokens or 0)
        # the answer ends at its end-of-sequence token (included) or at max_tokens
        self.total = budget if self.eos_at < 0 or self.eos_at >= budget else self.eos_at + 1
        self.offset = sum(prompt_ids[-8:])  # the same prompt, the same answer
        self.made = 0
        self.taken = 0  # made and handed out
        self.unsent = 0  # made since the consumer was last woken
        self.ready_at = 0.0
        self.finish: str | None = None
        self.event = asyncio.Event()
        if self.output_kind == RequestOutputKind.CUMULATIVE:
            raise ValueError("the synthetic engine streams deltas or final outputs only")

    def finish_reason(self) -> str:
        return "stop" if self.total == self.eos_at + 1 else "length"


@final
class SyntheticLLM:
    """AsyncLLM's ``generate`` and ``abort`` over a clock: see the module's docstring."""

    def __init__(
        self,
        timing: SyntheticSettings,
        tokenizer: Any,
        *,
        max_num_seqs: int,
        stream_interval: int = 1,
        on_step: Callable[[int, int, int], None] | None = None,
    ) -> None:
        self.timing = timing
        self.passage = Passage(tokenizer)
        self.max_num_seqs = max_num_seqs
        self.stream_interval = stream_interval
        # (running, waiting, tokens made) after each step: the engine's stats
        self.on_step = on_step
        self.steps = 0
        self.made = 0  # tokens, all requests
        self._running: list[_Run] = []
        self._waiting: deque[_Run] = deque()
        self._runs: dict[str, _Run] = {}
        self._clock: asyncio.Task[None] | None = None

    @property
    def running(self) -> int:
        return len(self._running)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    async def generate(
        self, prompt: Any, sampling_params: Any, request_id: str, **_: Any
    ) -> AsyncGenerator[Any, None]:
        """Outputs of one request, as vLLM's: DELTA (merged when behind) or FINAL_ONLY."""
        if request_id in self._runs:
            raise ValueError(f"request id {request_id} is already running")
        run = _Run(request_id, _prompt_ids(prompt), sampling_params, self.timing)
        interval = max(
            self.stream_interval, int(getattr(sampling_params, "stream_interval", 0) or 0)
        )
        self._runs[request_id] = run
        self._waiting.append(run)
        if self._clock is None or self._clock.done():
            self._clock = asyncio.create_task(self._tick(), name="synthetic-engine-clock")
        try:
            while True:
                await run.event.wait()
                run.event.clear()
                output = self._take(run, interval)
                if output is not None:
                    yield output
                if run.finish is not None and run.taken == run.made:
                    return
        finally:
            self._drop(run)

    async def abort(self, request_id: str | Iterable[str], internal: bool = False) -> None:
        for rid in [request_id] if isinstance(request_id, str) else request_id:
            run = self._runs.get(rid)
            if run is not None and run.finish is None:
                self._unschedule(run)
                run.finish = "abort"
                run.event.set()

    # ── the clock ──
    async def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        step = self.timing.step_seconds
        start = loop.time()
        done = 0  # steps made since start
        while self._running or self._waiting:
            delay = start + (done + 1) * step - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            due = int((loop.time() - start) / step)  # a late wake makes every step it missed
            steps = max(1, due - done)
            done += steps
            self._step(steps, loop.time())

    def _step(self, steps: int, now: float) -> None:
        while self._waiting and len(self._running) < self.max_num_seqs:
            run = self._waiting.popleft()
            run.ready_at = now + len(run.prompt_ids) * self.timing.prefill_seconds_per_token
            self._running.append(run)
        made = 0
        ended = False
        interval = self.stream_interval
        for run in self._running:
            if run.ready_at > now:
                continue
            new = min(steps, run.total - run.made)
            run.made += new
            run.unsent += new
            made += new
            if run.made == run.total:
                run.finish = run.finish_reason()
                ended = True
                run.event.set()
            elif run.taken == 0 or run.unsent >= interval:
                run.event.set()
        if ended:
            self._running = [run for run in self._running if run.finish is None]
        self.steps += steps
        self.made += made
        if self.on_step is not None:
            self.on_step(len(self._running), len(self._waiting), made)

    # ── outputs ──
    def _take(self, run: _Run, interval: int) -> Any:
        """What the consumer has not had yet, as one RequestOutput (None: nothing to hand)."""
        from vllm.outputs import CompletionOutput, RequestOutput
        from vllm.sampling_params import RequestOutputKind

        final_only = run.output_kind == RequestOutputKind.FINAL_ONLY
        if run.finish is None and (final_only or (run.taken and run.unsent < interval)):
            return None  # woken early (an interval set per request, above the engine's)
        start = 0 if final_only else run.taken
        if run.made == start and run.finish is None:
            return None
        run.taken, run.unsent = run.made, 0
        ended = run.finish is not None
        completions = []
        for index in range(run.samples):
            ids, text = self.passage.tokens(run.offset + 7 * index, start, run.made, run.eos_at)
            completions.append(
                CompletionOutput(
                    index=index,
                    text=text if run.text else "",
                    token_ids=ids,
                    cumulative_logprob=None,
                    logprobs=None,
                    finish_reason=run.finish,
                )
            )
        return RequestOutput(
            run.request_id, None, run.prompt_ids, None, completions, ended, num_cached_tokens=0
        )

    def _unschedule(self, run: _Run) -> None:
        if run in self._waiting:
            self._waiting.remove(run)
        with contextlib.suppress(ValueError):
            self._running.remove(run)

    def _drop(self, run: _Run) -> None:
        """The consumer left (or ended): nothing of the request stays."""
        if self._runs.get(run.request_id) is run:
            del self._runs[run.request_id]
        if run.finish is None:
            run.finish = "abort"
            self._unschedule(run)

    async def close(self) -> None:
        for run in list(self._runs.values()):
            await self.abort(run.request_id)
        if self._clock is not None:
            self._clock.cancel()
            await asyncio.gather(self._clock, return_exceptions=True)


def _prompt_ids(prompt: Any) -> list[int]:
    """A TokensPrompt (dict), or what a renderer made of one (an object or dict with ids)."""
    ids = prompt.get("prompt_token_ids") if isinstance(prompt, dict) else None
    if ids is None:
        ids = getattr(prompt, "prompt_token_ids", None)
    if ids is None:
        raise ValueError("the synthetic engine takes token ids")
    return list(ids)


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


__all__ = ["Passage", "SyntheticEngine", "SyntheticLLM"]
