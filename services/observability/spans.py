"""The spans request code opens itself: computations, and the engine run with GenAI attributes.

    server span (services/api/interceptors/tracing.py sets CURRENT_TRACER for the call)
     ├── cache.lookup ── prompt.render                      span("prompt.render")
     ├── cache.lookup ── media.decode / media.encode        span("media.decode")
     └── text_completion {model}                            EngineTrace (engine/worker.py)
          ├── engine.queue     queued ─▶ scheduled          ┐ vLLM's own timestamps
          ├── engine.prefill   scheduled ─▶ first token     │ (RequestOutput.metrics, the
          └── engine.decode    first token ─▶ last token    ┘ engine core's monotonic clock,
                                                                   read into EngineTimes)

With tracing off nothing here sets CURRENT_TRACER, and each helper costs one context-variable
read: ``span()`` hands back a shared null context, ``EngineTrace.start`` a shared untraced one.

Ending a span is deferred (``later``): the end time is taken at once, and the SDK's work (its
attributes, the phases' child spans, ``end()`` and the processors' on_end) runs when the event loop
is next free: while the request waits for the engine, or after its answer has been handed to gRPC.
Measured on a cached-image request: the spans' bookkeeping was most of tracing's cost on the
request's path. ``flush_pending()`` runs what is pending now (tests, shutdown).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Final, final

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer

from ..types import EngineDelta, EngineRequest, EngineTimes

# The tracer of the server handling this call: set by the API's tracing interceptor in the
# call's task, inherited by every task the call creates (cache computations included).
CURRENT_TRACER: contextvars.ContextVar[Tracer | None] = contextvars.ContextVar(
    "mmgate_tracer", default=None
)

_NO_SPAN: Final = contextlib.nullcontext(None)


@final
class _Later:
    """Span work for when the loop is free: FIFO, one loop callback for each batch."""

    __slots__ = ("_pending", "_scheduled")

    def __init__(self) -> None:
        self._pending: list[Callable[[], None]] = []
        self._scheduled = False

    def __call__(self, work: Callable[[], None]) -> None:
        self._pending.append(work)
        if self._scheduled:
            return
        try:
            asyncio.get_running_loop().call_soon(self.flush)
        except RuntimeError:  # no loop in this thread: now
            self.flush()
            return
        self._scheduled = True

    def flush(self) -> None:
        self._scheduled = False
        pending, self._pending = self._pending, []
        for work in pending:
            work()


later: Final = _Later()


def flush_pending() -> None:
    """End every span whose end was deferred: before reading finished spans, or exporting."""
    later.flush()


def span(
    name: str, attributes: Mapping[str, str | int | float | bool] | None = None
) -> contextlib.AbstractContextManager[Span | None]:
    """A child span of the current one around a computation; a null context when not tracing."""
    tracer = CURRENT_TRACER.get()
    if tracer is None:
        return _NO_SPAN
    return _started(tracer, name, attributes)


@contextlib.contextmanager
def _started(
    tracer: Tracer, name: str, attributes: Mapping[str, str | int | float | bool] | None
) -> Iterator[Span]:
    with tracer.start_as_current_span(name, attributes=attributes) as current:
        yield current


# ── the engine ───────────────────────────────────────────────────────────────────────────────

OPERATION: Final = "text_completion"  # the engine takes a rendered prompt, chat or not
PROVIDER: Final = "vllm"


@final
class EngineTrace:
    """The span of one engine request, with vLLM's queue, prefill and decode times as children.

    Not made current: the engine stream is an async generator, and a span it made current would
    leak into its consumer between tokens. Its context reaches vLLM through ``headers()``.
    """

    __slots__ = (
        "_cached",
        "_finishes",
        "_first_at",
        "_last_at",
        "_outputs",
        "_prompt_tokens",
        "_started_at",
        "_tracer",
        "span",
    )

    def __init__(self, span: Span | None, tracer: Tracer | None = None) -> None:
        self.span = span
        self._tracer = tracer
        self._outputs = 0
        self._prompt_tokens = 0
        self._cached = 0
        self._finishes: list[str] = []  # each sample's, as it ends
        self._started_at = time.monotonic()
        self._first_at = 0.0
        self._last_at = 0.0

    @classmethod
    def start(cls, model: str, request: EngineRequest) -> EngineTrace:
        tracer = CURRENT_TRACER.get()
        if tracer is None:
            return _UNTRACED
        sampling, images = request.sampling, request.images
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": OPERATION,
            "gen_ai.provider.name": PROVIDER,
            "gen_ai.request.model": model,
            "gen_ai.response.model": model,
            # the LoRA adapter answered through ("" : the base model); names are admin-chosen
            "mmgate.adapter": request.adapter.name if request.adapter is not None else "",
            # the caller's id where it gave one; the engine's own id beside it
            "gen_ai.response.id": request.label or request.request_id,
            "mmgate.engine.request_id": request.request_id,
            "gen_ai.request.max_tokens": sampling.max_tokens,
            "mmgate.engine.prompt_tokens": len(request.prompt_token_ids),
            "mmgate.engine.images": len(images.items) if images is not None else 0,
        }
        for name, value in (
            ("gen_ai.request.temperature", sampling.temperature),
            ("gen_ai.request.top_p", sampling.top_p),
            ("gen_ai.request.top_k", sampling.top_k),
            ("gen_ai.request.seed", sampling.seed),
            ("gen_ai.request.presence_penalty", sampling.presence_penalty),
            ("gen_ai.request.frequency_penalty", sampling.frequency_penalty),
        ):
            if value is not None:
                attributes[name] = value
        if sampling.stop:
            attributes["gen_ai.request.stop_sequences"] = list(sampling.stop)
        if sampling.n > 1:
            attributes["gen_ai.request.choice.count"] = sampling.n
        if (constraint := sampling.constraint) is not None:
            # the kind only: a schema or regex is the caller's text, not a span's
            json = constraint.kind in ("json_schema", "json_object")
            attributes["gen_ai.output.type"] = "json" if json else "text"
            attributes["mmgate.engine.constraint"] = constraint.kind
        started = tracer.start_span(
            f"{OPERATION} {model}", kind=SpanKind.INTERNAL, attributes=attributes
        )
        return cls(started, tracer)

    def headers(self, given: Mapping[str, str] | None) -> Mapping[str, str] | None:
        """The W3C trace context to hand vLLM: this span's when traced, else what the client
        sent (``trace_headers``), so vLLM's own spans join the trace under this one."""
        if self.span is None or not self.span.get_span_context().is_valid:
            return given
        from opentelemetry import propagate  # reads the propagators' entry points: ~40 ms

        carrier: dict[str, str] = {}
        propagate.inject(carrier, context=trace.set_span_in_context(self.span))
        return carrier or given

    def observe(self, delta: EngineDelta) -> None:
        """One delta of the engine's stream."""
        if self.span is None:
            return
        now = time.monotonic()
        if not self._first_at:
            self._first_at = now
        self._last_at = now
        self._outputs += len(delta.token_ids)
        self._prompt_tokens = delta.prompt_tokens or self._prompt_tokens
        self._cached = delta.num_cached_tokens or self._cached
        if delta.finish_reason is not None:
            self._finishes.append(delta.finish_reason)

    def end(self, error: BaseException | None = None, times: EngineTimes | None = None) -> None:
        """End the span; ``times``: vLLM's timestamps of the request, for its phases."""
        current = self.span
        if current is None:
            return
        self.span = None  # ends once
        ended_ns = time.time_ns()
        later(lambda: self._record(current, ended_ns, error, times))

    def _record(
        self, current: Span, ended_ns: int, error: BaseException | None, times: EngineTimes | None
    ) -> None:
        attributes: dict[str, Any] = {
            "gen_ai.usage.output_tokens": self._outputs,
            "gen_ai.usage.cache_read_input_tokens": self._cached,
        }
        if self._prompt_tokens:
            attributes["gen_ai.usage.input_tokens"] = self._prompt_tokens
        if self._finishes:
            attributes["gen_ai.response.finish_reasons"] = self._finishes
        else:
            # left before the engine finished: the stream was closed, and that aborts it
            attributes["mmgate.engine.aborted"] = True
        current.set_attributes(attributes)  # one lock round, as in LookupSpans
        if error is not None and isinstance(error, Exception):
            current.set_attribute("error.type", type(error).__qualname__)
            current.set_status(Status(StatusCode.ERROR, type(error).__qualname__))
        if current.is_recording():
            self._phases(current, times)
        current.end(end_time=ended_ns)

    def _phases(self, parent: Span, times: EngineTimes | None) -> None:
        """Child spans for the engine's phases, placed with vLLM's own timestamps."""
        # engine-core timestamps are time.monotonic() of the engine core process: the same
        # clock as this process's on one machine
        offset_ns = time.time_ns() - time.monotonic_ns()
        if times is not None:
            points = {
                "queued": times.queued,
                "scheduled": times.scheduled,
                "first": times.first_token,
                "last": times.last_token,
            }
            clock = "vllm"
            facts: dict[str, Any] = {"mmgate.engine.preemptions": times.preemptions}
        else:
            # vLLM kept no per-request stats (disable_log_stats): mmgate's side, queue unknown
            points = {
                "queued": 0.0,
                "scheduled": self._started_at,
                "first": self._first_at,
                "last": self._last_at,
            }
            clock = "mmgate"
            facts = {}
        parent.set_attributes({**facts, "mmgate.engine.clock": clock})
        context = trace.set_span_in_context(parent)
        tracer = self._tracer
        assert tracer is not None
        for name, begin, until in (
            ("engine.queue", "queued", "scheduled"),
            ("engine.prefill", "scheduled", "first"),
            ("engine.decode", "first", "last"),
        ):
            start, stop = points[begin], points[until]
            if not start or not stop or stop < start:
                continue  # that phase never began (aborted while queued, say)
            child = tracer.start_span(
                name,
                context=context,
                start_time=int(start * 1e9) + offset_ns,
                attributes={"mmgate.engine.clock": clock},
            )
            child.end(end_time=int(stop * 1e9) + offset_ns)


_UNTRACED: Final = EngineTrace(None)

__all__ = ["CURRENT_TRACER", "EngineTrace", "flush_pending", "later", "span"]
