"""The engine worker: one vLLM ``AsyncLLM`` in this process, its engine core in a child process.

    pipeline ── generate(EngineRequest: token ids, Sampling, images) ──▶ AsyncLLM.generate
        ▲                                             (DELTA, or FINAL_ONLY) │ RequestOutput
        └──── EngineDelta per sample (text, token ids, finish, logprobs) ◀── outputs.deltas_of
    vLLM's output handler ── record(scheduler, iteration stats) ──▶ stats.py ─▶ EngineStats

vLLM is imported when the worker starts, not when this module is imported: the import alone takes
seconds, and unit tests, the CLI client and the cache actor never need it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import shutil
import tempfile
from collections.abc import AsyncGenerator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, final

from prometheus_client.core import Metric

from ..config import EngineSettings, Settings, default_model_cache
from ..errors import AdapterNotFound, AdapterRefused, EngineUnavailable
from ..observability.adapter_metrics import adapter_families
from ..observability.metric_families import engine_families
from ..observability.spans import EngineTrace
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
from .adapters import AdapterSet, planned_rank, planned_slots
from .dtypes import VERDICTS_FILE, Cpu, DtypeChoice, Verdicts, choose_dtype, this_cpu
from .outputs import deltas_of, times_of
from .plan import EnginePlan
from .progress import Progress
from .sampling import refusal, vllm_sampling
from .stats import Counters, TokenCounters, stats_recorder_factory
from .tensors import engine_image_data, engine_video_data
from .tokenizers import private_copy
from .tools import template_takes_tools

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM

log = logging.getLogger("mmgate.engine")


@final
class EngineWorker:
    """Owns the ``AsyncLLM``: start, generate, abort, stats, close."""

    def __init__(
        self,
        settings: EngineSettings,
        *,
        verdicts: Verdicts | None = None,
        cpu: Cpu | None = None,
    ) -> None:
        self.settings = settings
        self.plan: EnginePlan | None = None  # what start() was handed
        self.model_name = ""
        self._engine: AsyncLLM | None = None
        self._counters = Counters()
        self._tokens = TokenCounters()
        # the watchdog's view: requests open here, the engine's last step
        self.progress = Progress()
        self._closed = False
        self.max_model_len = settings.max_model_len
        self.vocab_size = 0  # the model's, once started
        # what dtype=auto decides from: injectable (tests stand in another CPU and its verdicts)
        self.cpu = cpu
        self.verdicts = verdicts or Verdicts(default_model_cache() / VERDICTS_FILE)
        self._dtype_choice: DtypeChoice | None = None
        # vLLM exports its own spans (engine.extra otlp_traces_endpoint): it takes trace headers
        self.vllm_traces = False
        # the LoRA adapters served, once started with any (settings.lora)
        self.adapters: AdapterSet | None = None

    def served_name(self, model: str) -> str:
        """The name ``model`` (a folder or a hub name) is served under."""
        return self.settings.served_model_name or model.rstrip("/").rsplit("/", 1)[-1]

    @property
    def dtype(self) -> str:
        """The dtype the engine runs in (and mmgate's vision encoder with it)."""
        return self.dtype_choice().dtype

    def dtype_choice(self) -> DtypeChoice:
        """The dtype and why: ``dtype=auto`` on a CPU decides by evidence (dtypes.py)."""
        if self._dtype_choice is None:
            if self.settings.dtype != "auto":
                self._dtype_choice = DtypeChoice(self.settings.dtype, "set by MMGATE_ENGINE__DTYPE")
            else:
                from vllm.platforms import current_platform

                self._dtype_choice = choose_dtype(
                    "auto",
                    on_cpu=current_platform.is_cpu(),
                    cpu=self.cpu if self.cpu is not None else this_cpu(),
                    verdicts=self.verdicts,
                )
        return self._dtype_choice

    def engine_args(self, plan: EnginePlan) -> Any:
        from vllm.config import StructuredOutputsConfig
        from vllm.engine.arg_utils import AsyncEngineArgs

        s = self.settings
        kwargs: dict[str, Any] = {
            "model": plan.model,
            "served_model_name": self.served_name(plan.model),
            "dtype": self.dtype,
            "max_model_len": s.max_model_len,
            "max_num_seqs": s.max_num_seqs,
            "kv_cache_dtype": s.kv_cache_dtype,
            "enable_prefix_caching": s.enable_prefix_caching,
            "tensor_parallel_size": s.tensor_parallel_size,
            "enforce_eager": s.enforce_eager,
            "seed": s.seed,
            "enable_log_requests": False,
            "scheduling_policy": "priority" if plan.by_priority else "fcfs",
        }
        kwargs["structured_outputs_config"] = StructuredOutputsConfig(
            backend=s.structured_output_backend, disable_any_whitespace=s.compact_json
        )
        if s.block_size is not None:
            kwargs["block_size"] = s.block_size
        if s.stream_interval > 1:
            # only when raised: at 1, vLLM's default stands (and a vLLM without it still starts)
            kwargs["stream_interval"] = s.stream_interval
        if s.kv_cache_memory_bytes is not None:
            kwargs["kv_cache_memory_bytes"] = s.kv_cache_memory_bytes
        if not self._on_cpu():
            share = s.gpu_memory_utilization if plan.device_share is None else plan.device_share
            kwargs["gpu_memory_utilization"] = share
        if plan.images is not None:
            limits = {"image": plan.images.per_prompt}
            if plan.images.videos:
                limits["video"] = plan.images.videos
            kwargs["limit_mm_per_prompt"] = limits
            # mmgate's encoder-output cache hands vLLM embeddings instead of pixels
            kwargs["enable_mm_embeds"] = plan.images.embeddings or plan.images.video_embeddings
        if s.lora:
            # one slot more on the CPU: the null adapter's, the last (adapters.py)
            slots = planned_slots(s) + int(self._on_cpu())
            kwargs.update(
                enable_lora=True,
                max_loras=slots,
                max_lora_rank=planned_rank(s),
                # every adapter served, the null one, and a few draining after an unload
                max_cpu_loras=max(slots, s.max_adapters + 1),
            )
        kwargs.update(s.extra)
        return AsyncEngineArgs(**kwargs)

    @staticmethod
    def _on_cpu() -> bool:
        from vllm.platforms import current_platform

        return bool(current_platform.is_cpu())

    async def start(self, plan: EnginePlan) -> None:
        """Load the planned model and start the engine core (seconds to a minute); once."""
        from vllm.v1.engine.async_llm import AsyncLLM

        if self.plan is not None:
            raise RuntimeError("the engine has started already")
        self.plan = plan
        self.model_name = self.served_name(plan.model)
        args = self.engine_args(plan)
        choice = self.dtype_choice()
        log.info("engine dtype %s: %s", args.dtype, choice.reason)
        factory = stats_recorder_factory(self._counters, self._tokens, self.progress)
        # Built in a thread so the loop keeps answering health checks meanwhile; with no loop
        # in that thread, AsyncLLM starts its output handler on the first request instead.
        # (no local name for the engine: a frame kept alive by a library would keep it too, and
        # its __del__ at interpreter exit then fails)
        self._engine = await asyncio.to_thread(
            AsyncLLM.from_engine_args, args, stat_loggers=[factory]
        )
        self.max_model_len = self._require().model_config.max_model_len
        self.vocab_size = self._require().model_config.get_vocab_size()
        observability = getattr(self._require(), "observability_config", None)
        self.vllm_traces = bool(getattr(observability, "otlp_traces_endpoint", None))
        if self.settings.lora:
            await self._serve_adapters(plan)
        log.info("engine ready: %s (max_model_len %d)", self.model_name, self.max_model_len)

    async def _serve_adapters(self, plan: EnginePlan) -> None:
        engine = self._require()
        config = engine.model_config
        self.adapters = AdapterSet(
            self.settings,
            self._require,
            Path(tempfile.mkdtemp(prefix="mmgate-adapters-")),
            text_config=config.hf_text_config.to_dict(),
            max_rank=planned_rank(self.settings),
            language_only=plan.images is not None and plan.images.embeddings,
            multimodal=bool(config.is_multimodal_model),
        )
        # the last of the engine's slots (vLLM's max_loras), where a base-model row's -1 points
        last = int(engine.vllm_config.lora_config.max_loras) - 1
        await self.adapters.start(null_slot=last if self._on_cpu() else None)

    # ── adapters ─────────────────────────────────────────────────────────────────────────────

    def adapter(self, name: str) -> AdapterRef:
        """The adapter served as ``name`` (AdapterNotFound: none)."""
        if self.adapters is None:
            raise AdapterNotFound(name)
        return self.adapters.resolve(name)

    def served_adapters(self) -> tuple[AdapterRef, ...]:
        if self.adapters is None:
            return ()
        return tuple(served.ref for served in self.adapters.served.values())

    def adapter_stats(self) -> AdapterStats:
        return AdapterStats() if self.adapters is None else self.adapters.stats()

    async def load_adapter(self, name: str, path: str) -> tuple[AdapterRef, bool]:
        """Serve the folder at ``path`` under the adapter root as ``name``; refused
        (AdapterRefused): nothing changed."""
        self._require()
        if self.adapters is None:
            raise AdapterRefused("path", NO_ADAPTER_ROOT)
        return await self.adapters.load_from_root(name, path)

    def unload_adapter(self, name: str) -> int:
        """Stop serving ``name``; the runs still going on it finish on it."""
        if self.adapters is None:
            raise AdapterNotFound(name)
        return self.adapters.unload(name)

    @property
    def ready(self) -> bool:
        return self._engine is not None and not self._closed and not self._engine.errored

    @property
    def failed(self) -> bool:
        """The engine died (its core process exited or its output handler failed)."""
        return self._engine is not None and not self._closed and bool(self._engine.errored)

    @property
    def stopped(self) -> bool:
        return self._closed

    @property
    def takes_images(self) -> bool:
        return bool(self._require().model_config.is_multimodal_model)

    @property
    def tokenizer(self) -> Any:
        return self._require().get_tokenizer()

    def facts(self) -> ModelFacts:
        """The model's vocabulary, its end and beginning ids, whether it has a chat template."""
        engine = self._require()
        tokenizer = engine.get_tokenizer()
        eos = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
        # a model's generation config may name more ends than its tokenizer (vLLM stops at all)
        generation = engine.model_config.try_get_generation_config() or {}
        named = generation.get("eos_token_id")
        eos.update(named if isinstance(named, list) else [] if named is None else [named])
        return ModelFacts(
            vocab_size=self.vocab_size,
            eos_token_ids=tuple(sorted(int(i) for i in eos)),
            bos_token_id=tokenizer.bos_token_id,
            has_chat_template=getattr(tokenizer, "chat_template", None) is not None,
            template_takes_tools=template_takes_tools(getattr(tokenizer, "chat_template", None)),
            structured_output_backend=engine.vllm_config.structured_outputs_config.backend,
        )

    def tokenizer_copy(self) -> Any:
        """A deep copy of the tokenizer for one thread alone (none of vLLM's pooled copies)."""
        return private_copy(self.tokenizer)

    def stats(self) -> EngineStats:
        stats = self._counters.snapshot()
        if not self.ready:
            # the engine's last report is not what runs now: nothing does
            stats = dataclasses.replace(stats, running=0, waiting=0, kv_cache_usage=0.0)
        return stats

    def collect(self) -> Iterator[Metric]:
        """The engine's own figures and its adapters' (metrics.py)."""
        yield from engine_families(self.ready, self.stats(), self.token_stats())
        yield from adapter_families(self.adapter_stats())

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

    async def generate(self, request: EngineRequest) -> AsyncGenerator[EngineDelta, None]:
        """Stream one request's new tokens; leaving early aborts it in the engine."""
        from vllm.exceptions import VLLMValidationError
        from vllm.inputs import TokensPrompt

        engine = self._require()
        request_id, sampling, images = request.request_id, request.sampling, request.images
        params = vllm_sampling(sampling, final_only=request.final_only)
        if request.adapter is not None and self.adapters is None:
            raise AdapterNotFound(request.adapter.name)
        generated = 0
        # set once vLLM says the request finished ("abort" included); None: it is still running
        finish_reason: str | None = None
        prompt = TokensPrompt(prompt_token_ids=list(request.prompt_token_ids))
        if request.cache_salt is not None:
            # mixed into the first KV block's hash: no block of this tenant's prompts matches
            # another tenant's, so cached_prompt_tokens cannot tell one what another sent
            prompt["cache_salt"] = request.cache_salt
        media: dict[str, Any] = {}
        uuids: dict[str, Any] = {}
        if images is not None and images.items:
            media["image"] = engine_image_data(images)
            # vLLM's processor and prefix caches key on the digest, as mmgate's cache does
            uuids["image"] = list(images.uuids)
        if request.videos is not None and request.videos.items:
            media["video"] = engine_video_data(request.videos)
            uuids["video"] = list(request.videos.uuids)
        if media:
            prompt["multi_modal_data"] = media
            prompt["multi_modal_uuids"] = uuids
        # held until the run ends (released below): an unload lets it finish
        lora = await self.adapters.acquire(request.adapter) if self.adapters is not None else None
        span = EngineTrace.start(self.model_name, request)
        outputs = engine.generate(
            prompt,
            params,
            request_id,
            lora_request=lora.request() if lora is not None else None,
            priority=request.priority,
            # this request's span as the parent of vLLM's; without vLLM tracing it would only
            # log a warning for each request and drop them
            trace_headers=span.headers(request.trace_headers) if self.vllm_traces else None,
        )
        error: BaseException | None = None
        last: Any = None
        self.progress.opened(request_id, request.label)
        try:
            # aclosing: leaving early closes vLLM's generator now, which aborts the request
            async with contextlib.aclosing(outputs):
                async for output in outputs:
                    last = output
                    deltas = deltas_of(output, sampling.logprobs, sampling.prompt_logprobs)
                    if output.finished:  # every sample has ended
                        ended = {delta.finish_reason for delta in deltas}
                        finish_reason = "abort" if "abort" in ended else "finished"
                    for delta in deltas:
                        span.observe(delta)
                        generated += len(delta.token_ids)
                        yield delta
        except VLLMValidationError as refused:
            # vLLM checks a request (its constraint above all) as it takes it: nothing ran, so
            # nothing to count as aborted or to abort
            finish_reason = "refused"
            error = refusal(refused, sampling)
            raise error from None
        except BaseException as exc:
            error = exc
            raise
        finally:
            span.end(error, times_of(last) if last is not None else None)
            # Counted here: vLLM reports an aborted request among its finished ones only
            # sometimes (when its final "abort" output was delivered before the close).
            if finish_reason is None or finish_reason == "abort":
                self._counters.aborted += 1
            try:
                if finish_reason is None and not self._closed and not engine.errored:
                    # vLLM's iterator aborts on cancellation and on close itself; this covers
                    # anything else, and does nothing for a request already gone.
                    await asyncio.shield(engine.abort(request_id))
            finally:
                self.progress.closed(request_id)
                if self.adapters is not None:
                    self.adapters.release(lora, generated)

    async def close(self) -> None:
        if self._engine is None or self._closed:
            self._closed = True
            return
        self._closed = True
        engine, self._engine = self._engine, None
        # mmgate's use of the engine stops before the engine: vLLM's shutdown stops the core
        # first, and an output handler still waiting on it then logs EngineDeadError's traceback
        handler = getattr(engine, "output_handler", None)
        if isinstance(handler, asyncio.Task) and not handler.done():
            handler.cancel()
            await asyncio.gather(handler, return_exceptions=True)
        # shutdown() joins the engine core process: off the loop, so health keeps answering
        await asyncio.to_thread(engine.shutdown)
        if self.adapters is not None:
            await self.adapters.close()
            await asyncio.to_thread(shutil.rmtree, self.adapters.folder, True)


def vllm_engine(settings: Settings) -> EngineWorker:
    """The server's engine unless it is handed another factory: vLLM, with dtype=auto's
    evidence kept beside the converted models (dtypes.py)."""
    return EngineWorker(settings.engine, verdicts=Verdicts(settings.model_cache / VERDICTS_FILE))
