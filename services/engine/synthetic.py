"""A synthetic engine for load tests: a GPU's continuous batching at next to no CPU.

    SyntheticLLM.generate(prompt, SamplingParams, request_id) ─▶ RequestOutput, as AsyncLLM
        one clock for all requests: every ``step_seconds`` each running request (``max_num_seqs``
        at once, the rest wait in order) gets one token; a request starts after a prefill of
        ``prefill_seconds_per_token`` a prompt token; a late clock catches up (several tokens a
        request at once), so the rate is the engine's whatever the front end's loop does
        outputs merged for a consumer that falls behind, as vLLM's output collector does;
        one output every ``stream_interval`` tokens (the first and the last at once)
    SyntheticEngine (synthetic_engine.py): mmgate's ServedEngine over it

The tokens are a fixed passage's, tokenized once by the served model's own tokenizer, its text
cut at the tokenizer's offsets: detokenized text at no cost per token. A request's answer starts
in the passage where its prompt says (the same prompt, the same answer), or at the start of
the fixed ``answer`` where the settings give one, and ends with the model's end-of-sequence
token after ``answer_tokens`` unless ``ignore_eos``; ``max_tokens`` and
``min_tokens`` act as in vLLM. Stop strings, stop token ids, log-probabilities, constraints and
adapters are not modelled: a request is answered as if it had none.

A load-testing engine, never a default: a server runs it only where its settings name it
(``MMGATE_ENGINE__SYNTHETIC``: bench/frontend.py, the tests of the front end), and says so in its
log at start; SyntheticLLM alone stands in for vLLM's own servers (bench/synthetic_vllm.py).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncGenerator, Callable, Iterable
from typing import Any, final

from ..config import SyntheticSettings

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

    def __init__(self, tokenizer: Any, text: str = PASSAGE) -> None:
        encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        self.ids: tuple[int, ...] = tuple(int(i) for i in encoded["input_ids"])
        ends = [end for _, end in encoded["offset_mapping"]]
        starts = [0, *ends[:-1]]
        self.pieces: tuple[str, ...] = tuple(text[a:b] for a, b in zip(starts, ends, strict=True))
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
        "final_only",
        "finish",
        "made",
        "offset",
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
        self,
        request_id: str,
        prompt_ids: list[int],
        params: Any,
        timing: SyntheticSettings,
        final_only: bool,
        answer_tokens: int,
    ) -> None:
        self.request_id = request_id
        self.prompt_ids = prompt_ids
        self.samples = max(1, int(params.n or 1))
        self.text = params.detokenize
        self.final_only = final_only
        budget = int(params.max_tokens if params.max_tokens is not None else answer_tokens)
        self.eos_at = -1 if params.ignore_eos else max(answer_tokens, params.min_tokens or 0)
        # the answer ends at its end-of-sequence token (included) or at max_tokens
        self.total = budget if self.eos_at < 0 or self.eos_at >= budget else self.eos_at + 1
        # the same prompt, the same answer; a fixed answer from its start
        self.offset = 0 if timing.answer else sum(prompt_ids[-8:])
        self.made = 0
        self.taken = 0  # made and handed out
        self.unsent = 0  # made since the consumer was last woken
        self.ready_at = 0.0
        self.finish: str | None = None
        self.event = asyncio.Event()

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
        # vLLM's output types, imported once the engine is built (not on each output)
        from vllm.outputs import CompletionOutput, RequestOutput
        from vllm.sampling_params import RequestOutputKind

        self._completion, self._output, self._kinds = (
            CompletionOutput,
            RequestOutput,
            RequestOutputKind,
        )
        self.timing = timing
        self.passage = Passage(tokenizer, timing.answer or PASSAGE)
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
        kind = sampling_params.output_kind
        if kind == self._kinds.CUMULATIVE:
            raise ValueError("the synthetic engine streams deltas or final outputs only")
        final_only = kind == self._kinds.FINAL_ONLY
        # a fixed answer ends where its tokens do, the passage after answer_tokens
        length = len(self.passage.ids) if self.timing.answer else self.timing.answer_tokens
        run = _Run(
            request_id, _prompt_ids(prompt), sampling_params, self.timing, final_only, length
        )
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
        final_only = run.final_only
        if run.finish is None and (final_only or (run.taken and run.unsent < interval)):
            return None  # woken early (an interval set per request, above the engine's)
        start = 0 if final_only else run.taken
        if run.made == start and run.finish is None:
            return None
        run.taken, run.unsent = run.made, 0
        ended = run.finish is not None
        completions = []
        for index in range(run.samples):
            at = run.offset + (0 if self.timing.answer else 7 * index)
            ids, text = self.passage.tokens(at, start, run.made, run.eos_at)
            completions.append(
                self._completion(
                    index=index,
                    text=text if run.text else "",
                    token_ids=ids,
                    cumulative_logprob=None,
                    logprobs=None,
                    finish_reason=run.finish,
                )
            )
        return self._output(
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


__all__ = ["Passage", "SyntheticLLM"]
