"""One request through the pipeline, top-down: prompt, token budget, images, engine or shared run.

    Request ─▶ prompt stage (actor flight: render + tokenize, keyed by content)      prompts.py
            ─▶ token budget (image placeholders expanded as the media stage says)   budget.py
            ─▶ media stage (decode, encoder output; actor flights)                   media/
               (each tenant's images apart, and salted for vLLM's caches)            tenancy.py
            ─▶ response stage (actor flight, only for the "response" policy and a   responses.py
               deterministic request: one engine run shared by identical requests)
               or a run of its own; either way through the runner: the queue for    runner.py
               the engine's slots, fault injection, the engine                      engine/
            ─▶ EngineDelta ... EngineDelta (samples interleaved), Finished (each sample's
               end, usage, cache reports)

A unary call (``whole``) whose run no other request can join asks the engine for its outputs at
the end only (FINAL_ONLY): one output instead of one per step, for a caller that reads none of
them before the end; unless it asks for log-probabilities, whose conversion is then spread over
the run's steps rather than done at once on the event loop.

No gRPC here: the API edge turns GenerateRequest into a Request and these events into messages.
Every wait is bounded by the request's deadline; leaving the stream early (cancellation,
deadline) closes every generator down to the engine's, which aborts the engine request.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import AsyncGenerator, Iterator, Mapping
from typing import Any, final

from prometheus_client.core import Metric

from ..config import Settings
from ..engine.protocol import Engine
from ..engine.reasoning import ReasoningParsers, SampleReasoning
from ..engine.tools import AutoCalls, has_tool_parser
from ..errors import EngineUnavailable, InvalidRequest
from ..media_types import EngineVideos, VideoReport, VideoStats
from ..observability.media_metrics import media_families, video_families
from ..observability.metric_families import info_families
from ..observability.queue_metrics import QueueStats, queue_families
from ..observability.spans import span
from ..types import (
    AdapterRef,
    EngineDelta,
    EngineImages,
    Finished,
    GenerationRequest,
    ImageReport,
    MediaStats,
    SampleEnd,
    TokenLogprobs,
)
from .budget import fit
from .cache_front import CacheFront
from .chaos import NoChaos, injector
from .compiles import CompileGate
from .media import MediaStage
from .prompts import PromptStage, ToolTemplate
from .queue import EngineQueue
from .request import MediaCall, Request
from .responses import SharedResponses
from .runner import EngineRunner, QueueWait
from .tenancy import Isolation
from .threads import ThreadPools
from .tool_calls import CallStreams, read_all


@final
class Pipeline:
    """The request path below the API, for a started engine: what the servicers call.

    ``threads``, ``chaos`` and ``isolation`` are shared with the media stage and the server (its
    metrics read them before the engine has started); left out, each is made from ``settings``.
    """

    def __init__(
        self,
        settings: Settings,
        engine: Engine,
        cache: CacheFront,
        media: MediaStage,
        *,
        threads: ThreadPools | None = None,
        chaos: NoChaos | None = None,
        isolation: Isolation | None = None,
    ) -> None:
        self.settings = settings
        self.engine = engine
        self.cache = cache
        self.media = media
        # the thread pools of CPU-bound work
        self.threads = threads if threads is not None else ThreadPools(settings.threads)
        # faults on purpose (reliability runs only)
        self.chaos = chaos if chaos is not None else injector(settings.chaos)
        self.prompts = PromptStage(
            cache, self.threads, engine.tokenizer_copy, ToolTemplate(settings.engine.tool_template)
        )
        # the tool parser's tokenizer (vLLM's parsers read its vocabulary), made at first use
        self._parser_tokenizer: Any = None
        if not has_tool_parser(settings.engine.tool_parser):
            raise ValueError(f"vLLM has no tool parser named {settings.engine.tool_parser!r}")
        # the model's thinking kept apart from its answer (None: no reasoning parser)
        self.reasoning: ReasoningParsers | None = None
        if settings.engine.reasoning_parser:
            self._parser_tokenizer = engine.tokenizer_copy()
            self.reasoning = ReasoningParsers(
                settings.engine.reasoning_parser, self._parser_tokenizer
            )
        # where each tenant's entries live, at every cache level (the engine's included)
        self.isolation = isolation if isolation is not None else Isolation(settings.tenants)
        # the order of runs for the engine's slots, by tenant weight and priority
        lanes = settings.engine.max_num_seqs + settings.engine.queue_lead
        self.queue = EngineQueue(
            lanes if settings.engine.queue else None,
            settings.tenants,
            alternatives=settings.engine.max_logprob_alternatives,
        )
        # every engine run, shared or not: its queue wait, fault injection, the engine
        self.runner = EngineRunner(engine, self.queue, self.chaos)
        self.responses = SharedResponses(self.runner, cache, settings.default_deadline_seconds)
        # constrained requests: one grammar a tenant in the engine's compile queue
        self.compiles = CompileGate(settings.engine.compile_hold_seconds)

    def request(
        self,
        checked: GenerationRequest,
        tenant: str,
        deadline: float,
        trace_headers: Mapping[str, str],
        adapter: AdapterRef | None = None,
        priority: int = 0,
    ) -> Request:
        """A validated request of ``tenant``'s, under its own salt of the engine's caches,
        answered through ``adapter`` (None: the base model), at ``priority``."""
        return Request(
            checked,
            tenant,
            deadline,
            trace_headers,
            cache_salt=self.isolation.cache_salt(tenant),
            adapter=adapter,
            priority=priority,
        )

    async def tokenize(self, checked: GenerationRequest) -> tuple[int, ...]:
        """The token ids :meth:`generate` would give the engine for ``checked``'s prompt."""
        return await self.prompts.tokenize(checked)

    async def detokenize(self, token_ids: tuple[int, ...]) -> str:
        return await self.prompts.detokenize(token_ids)

    def check_ready(self, *, with_images: bool, with_videos: bool = False) -> None:
        """Refuse at once what cannot be served now, before any validation or cache work."""
        if not self.engine.ready:
            raise EngineUnavailable("the engine is not ready")
        if with_images:
            self.media.refuse()  # a text model's stage says why: ModelTakesNoImages
        if with_videos:
            self.media.videos.refuse()  # ModelTakesNoVideo

    async def generate(
        self, request: Request, *, whole: bool = False
    ) -> AsyncGenerator[EngineDelta | Finished, None]:
        """The request's token deltas (each with text or tokens), then one Finished; ``whole``:
        the caller reads nothing before the end (unary)."""
        checked, engine, media = request.checked, self.engine, self.media
        self.chaos.at_request(request.tenant, self.cache)
        prompt = await self.prompts.prompt(request, engine.model_name)
        # a clip's tokens depend on its frames and the model's processor: its placeholder is
        # counted as one, a lower bound, and the engine checks the whole length itself
        expanded = len(prompt.token_ids) + len(checked.images) * (media.placeholder_tokens - 1)
        sampling = fit(checked, expanded, engine.max_model_len, self.settings.default_max_tokens)
        images: EngineImages | None = None
        image_reports: tuple[ImageReport, ...] = ()
        isolation = self.isolation
        call = MediaCall(isolation.media_tenant(request.tenant), request.deadline)
        if checked.images:
            prepared = await media.prepare(checked.images, call)
            images, image_reports = prepared.engine, prepared.reports
            if images is not None:
                # vLLM's processor and encoder caches key on these: salted as the prefix cache
                uuids = isolation.image_uuids(request.tenant, images.uuids)
                images = dataclasses.replace(images, uuids=uuids)
        videos: EngineVideos | None = None
        video_reports: tuple[VideoReport, ...] = ()
        if checked.videos:
            clips = await media.videos.prepare(checked.videos, call)
            uuids = isolation.image_uuids(request.tenant, clips.engine.uuids)
            videos, video_reports = dataclasses.replace(clips.engine, uuids=uuids), clips.reports

        compile_ = None
        if sampling.constraint is not None:
            compile_ = await self.compiles.enter(request.tenant)
        from_cache = False
        if checked.cache_policy == "response" and sampling.deterministic:
            stream, from_cache = await self.responses.share(
                request, prompt, sampling, images, videos
            )
        else:
            # log-probabilities come step by step even so: all of a run's at once (8 samples of
            # 480 tokens, 20 alternatives each) held the event loop for 2 s as they were converted
            final_only = (
                whole
                and self.settings.engine.unary_final_only
                and sampling.logprobs is None
                and sampling.prompt_logprobs is None
            )
            run = request.engine_request(
                prompt.token_ids, sampling, images, videos, final_only=final_only
            )
            stream = self.runner.run(run, request.tenant)

        tally = Tally(sampling.n, keep_text=checked.tools is not None)
        # each sample's calls handed out as they are made, whole and checked
        calls = None
        if checked.tools is not None and checked.tools.choice != "none":
            auto = await self._auto_calls() if checked.tools.choice == "auto" else None
            calls = CallStreams(checked.tools, auto, sampling.n, self.threads)
        # each sample's thinking apart from its answer, as it comes
        reasoning = self.reasoning
        readers = None if reasoning is None else [reasoning.sample() for _ in range(sampling.n)]
        compiled = False
        queue_ms = 0.0  # a run joined or replayed waited in no queue for this request
        try:
            async with contextlib.aclosing(stream) as events:
                async for event in events:
                    if isinstance(event, QueueWait):
                        queue_ms = event.seconds * 1000
                        continue
                    if compile_ is not None and not compiled:
                        compiled = True
                        self.compiles.compiled(compile_)
                    if readers is not None:
                        event = _split(readers, event, checked.include_reasoning)
                    tally.add(event)
                    if calls is not None and event.text:
                        index = event.index
                        output = functools.partial(tally.text, index)
                        if made := await calls.made(index, output, event.text):
                            event = dataclasses.replace(event, tool_calls=made)
                    if event.text or event.token_ids or event.reasoning or event.tool_calls:
                        yield event
        except (InvalidRequest, EngineUnavailable):
            # refused by the engine's compiler (or no engine): nothing left compiling
            if compile_ is not None and not compiled:
                compiled = True
                self.compiles.compiled(compile_)
            raise
        finally:
            if compile_ is not None and not compiled:
                self.compiles.left(compile_)
        samples = tally.ends()
        if calls is not None:
            samples = await self._with_calls(calls, samples, tally)
        yield Finished(
            request_id=checked.request_id,
            model=engine.model_name,
            finish_reason=samples[0].finish_reason,
            prompt_tokens=tally.prompt_tokens or len(prompt.token_ids),
            completion_tokens=sum(end.completion_tokens for end in samples),
            cached_prompt_tokens=0 if from_cache else tally.cached_prompt_tokens,
            response_from_cache=from_cache,
            lookups=tuple(request.lookups),
            images=image_reports,
            videos=video_reports,
            samples=samples,
            prompt_logprobs=tally.prompt_logprobs,
            adapter=request.adapter,
            queue_ms=queue_ms,
            priority=request.priority,
        )

    async def _auto_calls(self) -> AutoCalls:
        """The tool parser for one request's "auto" calls."""
        if self._parser_tokenizer is None:
            self._parser_tokenizer = await self.threads.run("render", self.engine.tokenizer_copy)
        return AutoCalls(self.settings.engine.tool_parser, self._parser_tokenizer)

    async def _with_calls(
        self, calls: CallStreams, samples: tuple[SampleEnd, ...], tally: Tally
    ) -> tuple[SampleEnd, ...]:
        """Each sample's end with the calls read from its whole text (tool_calls.py), those
        handed out as the stream went under the ids they had."""
        tools = calls.tools
        ends = []
        with span("tools.read", {"mmgate.tools.choice": tools.choice}) as traced:
            outputs = [
                (tally.text(end.index), end.finish_reason, tuple(calls.ids[end.index]))
                for end in samples
            ]
            # in a worker thread: the caller's schemas are checked, patterns and all
            readings = await self.threads.run("render", read_all, tools, outputs, calls.auto)
            if traced is not None:  # how many, never what: arguments are the caller's data
                traced.set_attribute("mmgate.tools.calls", sum(len(r.calls) for r in readings))
                traced.set_attribute("mmgate.tools.unread", sum(bool(r.error) for r in readings))
        for end, reading in zip(samples, readings, strict=True):
            finish = "tool_calls" if reading.calls else end.finish_reason
            ends.append(
                dataclasses.replace(
                    end,
                    finish_reason=finish,
                    tool_calls=reading.calls,
                    content=reading.content,
                    tool_parse_error=reading.error,
                )
            )
        return tuple(ends)

    def collect(self) -> Iterator[Metric]:
        """The model and media mode, the queue's and the media stage's figures (metrics.py)."""
        yield from info_families(self.engine.model_name, self.media.mode)
        yield from queue_families(self.queue.stats())
        yield from media_families(dataclasses.replace(self.media.stats))
        yield from video_families(dataclasses.replace(self.media.videos.stats))

    async def close(self) -> None:
        """Cancel shared-response producers still running (shutdown)."""
        await self.responses.close()


def _split(readers: list[SampleReasoning], delta: EngineDelta, include: bool) -> EngineDelta:
    """The delta's text as its answer, its thinking apart (left out unless ``include``)."""
    last = delta.finish_reason is not None
    reasoning, content = readers[delta.index].split(delta.text, delta.token_ids, last)
    return dataclasses.replace(delta, text=content, reasoning=reasoning if include else "")


@final
class Tally:
    """What a run's deltas add up to: each sample's tokens and end, the prompt's figures."""

    __slots__ = (
        "_ended",
        "_texts",
        "_tokens",
        "cached_prompt_tokens",
        "prompt_logprobs",
        "prompt_tokens",
    )

    def __init__(self, samples: int, *, keep_text: bool = False) -> None:
        self._tokens = dict.fromkeys(range(samples), 0)
        # each sample's text, where it is read at the end (tool calls)
        self._texts: dict[int, list[str]] | None = (
            {index: [] for index in range(samples)} if keep_text else None
        )
        self._ended: dict[int, EngineDelta] = {}  # each sample's last delta
        self.cached_prompt_tokens = 0  # as the run's latest delta says
        self.prompt_tokens = 0
        self.prompt_logprobs: tuple[TokenLogprobs, ...] = ()

    def add(self, delta: EngineDelta) -> None:
        self._tokens[delta.index] = self._tokens.get(delta.index, 0) + len(delta.token_ids)
        self.cached_prompt_tokens = delta.num_cached_tokens
        self.prompt_tokens = delta.prompt_tokens or self.prompt_tokens
        self.prompt_logprobs = delta.prompt_logprobs or self.prompt_logprobs
        if delta.finish_reason is not None:
            self._ended[delta.index] = delta
        if self._texts is not None and delta.text:
            self._texts.setdefault(delta.index, []).append(delta.text)

    def text(self, index: int) -> str:
        """Sample ``index``'s text (kept with ``keep_text``)."""
        assert self._texts is not None
        return "".join(self._texts.get(index, ()))

    def ends(self) -> tuple[SampleEnd, ...]:
        """Each sample's end, by index (a finish reason None: the run did not end it)."""
        ends = []
        for index, tokens in sorted(self._tokens.items()):
            last = self._ended.get(index)
            if last is None:
                ends.append(SampleEnd(index, None, None, tokens))
            else:
                ends.append(SampleEnd(index, last.finish_reason, last.stop_reason, tokens))
        return tuple(ends)


@final
class PipelineRef:
    """The pipeline, once the engine has started. The servicers exist, and the port is open,
    before it does: until then each call that needs it is told UNAVAILABLE."""

    def __init__(self) -> None:
        self.current: Pipeline | None = None

    def get(self) -> Pipeline:
        if self.current is None:
            raise EngineUnavailable("the engine is not ready")
        return self.current

    @property
    def media_mode(self) -> str:
        """The media stage's mode; "unknown" before the engine has started."""
        return self.current.media.mode if self.current is not None else "unknown"

    @property
    def media_stats(self) -> MediaStats:
        """The media stage's counts; none before the engine has started."""
        return self.current.media.stats if self.current is not None else MediaStats()

    @property
    def video_stats(self) -> VideoStats:
        """The video stage's counts; none before the engine has started."""
        current = self.current
        return dataclasses.replace(current.media.videos.stats) if current else VideoStats()

    def collect(self) -> Iterator[Metric]:
        """The pipeline's families (metrics.py), each there from the start: empty until the
        engine has started."""
        if self.current is not None:
            yield from self.current.collect()
            return
        yield from info_families("", self.media_mode)
        yield from queue_families(QueueStats())
        yield from media_families(MediaStats())
        yield from video_families(VideoStats())


__all__ = ["Pipeline", "PipelineRef", "Tally"]
