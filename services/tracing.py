"""OpenTelemetry traces: the provider and OTLP exporter, server spans, one span per cache lookup.

    gRPC call ─▶ OpenTelemetryAioServerInterceptor   server span "/mmgate.v1.Inference/Complete",
                                                     child of the client's traceparent
              ─▶ RpcStatus                           mmgate's fixes (below); CURRENT_TRACER set
              ─▶ metrics interceptor ─▶ servicer
    cache.get ─▶ LookupSpans.lookup_started          "cache.lookup", made current in the caller's
                                                     task: the flight's computation is its child
              ─▶ LookupSpans.lookup_finished         outcome, tier, wait, bytes; a coalesced
                                                     lookup links to its leader's span
    spans ─▶ BatchSpanProcessor ─▶ OTLP exporter (gRPC or HTTP/protobuf) ─▶ collector, Jaeger

With no endpoint (settings or ``OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT``) nothing is installed: no
provider, no interceptor, no lookup hook; services/spans.py's helpers then cost one
context-variable read each.

What opentelemetry-instrumentation-grpc 0.66b2 gets wrong on grpc.aio, and RpcStatus puts right
(it runs inside the instrumentation's span, so that span is current there):

- a client-cancelled or deadline-exceeded call ends the handler with CancelledError, which the
  instrumentation lets through without a status: the span said UNSET and rpc.grpc.status_code 0
  (OK). RpcStatus records CANCELLED, or DEADLINE_EXCEEDED when the deadline had passed.
- ``context.abort_with_status()`` (services/errors.py's only way out) is not hooked, and the
  statuses it does see it maps by the semantic conventions' server table, where INVALID_ARGUMENT
  or NOT_FOUND stay UNSET. RpcStatus reads the call's final code from ``context.code()`` and marks
  every non-OK code ERROR with "CODE: details": an operator searching for failed calls finds them.
- a streaming handler that writes with ``context.write()`` (Generate does) fails with "'async for'
  requires an object with __aiter__": the instrumentation iterates whatever the handler returns.
  RpcStatus awaits such a handler, and writes a generator handler's messages itself, so the
  instrumentation's generator never yields and a cancellation always lands inside the handler.
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import inspect
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal, final
from urllib.parse import urlsplit

import grpc
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, Status, StatusCode, Tracer

from cache_actor import (
    CacheOverloaded,
    CacheRecursionError,
    ComputeTimeout,
    LookupEvent,
    LookupHook,
    Outcome,
)

from .config import Settings, TracingSettings
from .observers import current_stage
from .spans import CURRENT_TRACER

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.sdk.trace.sampling import Sampler

log = logging.getLogger("mmgate.tracing")

OtlpProtocol = Literal["grpc", "http/protobuf"]
DEFAULT_SERVICE_NAME: Final = "mmgate"
# how long stop() waits for the last spans to leave
SHUTDOWN_SECONDS: Final = 10.0
# mmgate.cache.key: enough of the content digest to tell keys apart, none of the content
KEY_DIGITS: Final = 12


# ── settings ─────────────────────────────────────────────────────────────────────────────────


@final
@dataclass(frozen=True, slots=True)
class ExportPlan:
    """Where spans go. ``endpoint`` None: the exporter reads the OTEL_* variables itself."""

    protocol: OtlpProtocol
    endpoint: str | None


def export_plan(settings: TracingSettings, environ: Mapping[str, str]) -> ExportPlan | None:
    """The OTLP export the settings and environment ask for; None: tracing is off."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    protocol = settings.protocol or _env_protocol(environ)
    if settings.endpoint:
        return ExportPlan(protocol, _endpoint(settings.endpoint, protocol))
    if environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT"
    ):
        # the exporter applies the spec's rules itself (the signal path appended to the
        # generic endpoint, headers, certificates, timeouts)
        return ExportPlan(protocol, None)
    return None


def _env_protocol(environ: Mapping[str, str]) -> OtlpProtocol:
    named = (
        environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "grpc"
    ).strip()
    if named not in ("grpc", "http/protobuf"):
        raise ValueError(f"OTLP protocol {named!r}: mmgate exports grpc or http/protobuf")
    return "grpc" if named == "grpc" else "http/protobuf"


def _endpoint(endpoint: str, protocol: OtlpProtocol) -> str:
    if "://" not in endpoint:
        # "collector:4317": plaintext, as in-cluster collectors and Jaeger listen (https:// for TLS)
        endpoint = f"http://{endpoint}"
    if protocol == "http/protobuf" and urlsplit(endpoint).path in ("", "/"):
        endpoint = endpoint.rstrip("/") + "/v1/traces"
    return endpoint


def sampled_ratio(settings: TracingSettings, environ: Mapping[str, str]) -> float | None:
    """The share of new traces to record; None: the SDK reads OTEL_TRACES_SAMPLER itself."""
    if settings.sample_ratio is not None:
        return settings.sample_ratio
    if environ.get("OTEL_TRACES_SAMPLER"):
        return None
    text = environ.get("OTEL_TRACES_SAMPLER_ARG", "").strip()
    if not text:
        return 1.0
    try:
        ratio = float(text)
    except ValueError:
        raise ValueError(f"OTEL_TRACES_SAMPLER_ARG={text!r} is not a ratio") from None
    if not 0.0 <= ratio <= 1.0:
        raise ValueError(f"OTEL_TRACES_SAMPLER_ARG={text!r} is not between 0 and 1")
    return ratio


def service_name(settings: TracingSettings, environ: Mapping[str, str]) -> str:
    return settings.service_name or environ.get("OTEL_SERVICE_NAME") or DEFAULT_SERVICE_NAME


# ── the service's tracing ────────────────────────────────────────────────────────────────────


@final
class Tracing:
    """Traces for one server. Off (``enabled`` False, nothing installed) without an endpoint.

    ``span_processors`` are added beside the exporter (tests pass an in-memory one); given alone
    they turn tracing on without any export. The provider is this object's own, never the
    global one: several servers in one process each keep their spans.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        span_processors: Sequence[SpanProcessor] = (),
        environ: Mapping[str, str] | None = None,
    ) -> None:
        environ = os.environ if environ is None else environ
        self.settings = settings
        plan = export_plan(settings.tracing, environ)
        self.plan = plan
        self.enabled = plan is not None or bool(span_processors)
        self.lookup_hook: LookupHook | None = None
        self.provider: TracerProvider | None = None
        self.tracer: Tracer | None = None
        if not self.enabled:
            return
        # the SDK and the exporters are imported only when tracing is on
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        name = service_name(settings.tracing, environ)
        provider = TracerProvider(
            resource=Resource.create({"service.name": name}),
            sampler=_sampler(sampled_ratio(settings.tracing, environ)),
        )
        if plan is not None:
            provider.add_span_processor(BatchSpanProcessor(_exporter(plan)))
        for processor in span_processors:
            provider.add_span_processor(processor)
        self.provider = provider
        self.tracer = provider.get_tracer("mmgate")
        self.lookup_hook = LookupSpans(self.tracer)
        where = "no export" if plan is None else f"OTLP {plan.protocol} {plan.endpoint or '(env)'}"
        log.info("tracing on: service %s, %s", name, where)

    def server_interceptors(self) -> list[Any]:
        """Outermost first: the instrumentation's server span, then mmgate's status fixes."""
        if self.provider is None or self.tracer is None:
            return []
        from opentelemetry.instrumentation.grpc import aio_server_interceptor, filters

        traced = filters.negate(filters.health_check())  # health checks are not traced
        return [
            aio_server_interceptor(  # type: ignore[no-untyped-call]
                tracer_provider=self.provider, filter_=traced
            ),
            RpcStatus(self.tracer, traced),
        ]

    async def force_flush(self, timeout: float = SHUTDOWN_SECONDS) -> bool:
        """Export every ended span now (off the loop: the exporter blocks)."""
        provider = self.provider
        if provider is None:
            return True
        return await asyncio.to_thread(provider.force_flush, int(timeout * 1000))

    async def shutdown(self) -> None:
        """Flush and close the exporter; spans ended later are dropped."""
        provider, self.provider = self.provider, None
        if provider is None:
            return
        try:
            await asyncio.wait_for(asyncio.to_thread(provider.shutdown), SHUTDOWN_SECONDS)
        except TimeoutError:
            log.warning("trace exporter did not finish within %g s", SHUTDOWN_SECONDS)


def _sampler(ratio: float | None) -> Sampler | None:
    from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased, TraceIdRatioBased

    if ratio is None:
        return None
    # parent-based: a client's sampled traceparent is always followed, its unsampled one never
    return ParentBased(ALWAYS_ON if ratio >= 1.0 else TraceIdRatioBased(ratio))


def _exporter(plan: ExportPlan) -> SpanExporter:
    if plan.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter(endpoint=plan.endpoint)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
        OTLPSpanExporter as OTLPHttpSpanExporter,
    )

    return OTLPHttpSpanExporter(endpoint=plan.endpoint)


# ── server spans: what the aio instrumentation misses ───────────────────────────────────────

Behavior = Callable[[Any, Any], Any]


@final
class RpcStatus(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Inside the instrumentation's server span: the call's real final status, and the tracer."""

    def __init__(self, tracer: Tracer, traced: Callable[[Any], bool]) -> None:
        self._tracer = tracer
        self._traced = traced

    async def intercept_service(
        self, continuation: Callable[[Any], Any], handler_call_details: Any
    ) -> Any:
        handler = await continuation(handler_call_details)
        if handler is None or not self._traced(handler_call_details):
            return handler
        if handler.response_streaming:
            wrapped = self._stream(
                handler.stream_stream if handler.request_streaming else handler.unary_stream
            )
            factory = (
                grpc.stream_stream_rpc_method_handler
                if handler.request_streaming
                else grpc.unary_stream_rpc_method_handler
            )
        else:
            wrapped = self._unary(
                handler.stream_unary if handler.request_streaming else handler.unary_unary
            )
            factory = (
                grpc.stream_unary_rpc_method_handler
                if handler.request_streaming
                else grpc.unary_unary_rpc_method_handler
            )
        return factory(
            wrapped,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )

    def _unary(self, behavior: Behavior) -> Behavior:
        tracer = self._tracer

        async def unary(request: Any, context: Any) -> Any:
            # the call runs in its own task: the variable goes with it, and so do its children
            CURRENT_TRACER.set(tracer)
            server_span = trace.get_current_span()
            try:
                response = behavior(request, context)
                if inspect.isawaitable(response):
                    response = await response
            except BaseException as exc:
                _record_status(server_span, context, exc)
                raise
            _record_status(server_span, context, None)
            return response

        return unary

    def _stream(self, behavior: Behavior) -> Behavior:
        tracer = self._tracer

        async def stream(request: Any, context: Any) -> Any:
            CURRENT_TRACER.set(tracer)
            server_span = trace.get_current_span()
            try:
                responses = behavior(request, context)
                if hasattr(responses, "__aiter__"):
                    # written here rather than yielded: a generator suspended at a yield is
                    # not where a cancellation lands, and its span would end UNSET later
                    async for response in responses:
                        await context.write(response)
                elif inspect.isawaitable(responses):
                    await responses  # the handler writes with context.write() itself
                else:
                    for response in responses:
                        await context.write(response)
            except BaseException as exc:
                _record_status(server_span, context, exc)
                raise
            _record_status(server_span, context, None)
            return
            yield  # an async generator that yields nothing: what the instrumentation iterates

        return stream


def _record_status(span: Span, context: Any, error: BaseException | None) -> None:
    """Mark the server span with the status the call ends with, when it is not OK."""
    code: grpc.StatusCode | None = context.code()  # set by abort, abort_with_status, set_code
    details: str | bytes | None = None
    if code is not None:
        details = context.details()
    elif isinstance(error, asyncio.CancelledError | GeneratorExit):
        remaining = context.time_remaining()
        expired = remaining is not None and remaining <= 0
        code = grpc.StatusCode.DEADLINE_EXCEEDED if expired else grpc.StatusCode.CANCELLED
    elif error is not None:
        # what gRPC answers for an exception the handler let out
        code, details = grpc.StatusCode.UNKNOWN, type(error).__qualname__
    if code is None or code == grpc.StatusCode.OK or not span.is_recording():
        return
    if isinstance(details, bytes):
        details = details.decode(errors="replace")
    span.set_attribute("rpc.grpc.status_code", code.value[0])
    span.set_status(Status(StatusCode.ERROR, f"{code.name}: {details}" if details else code.name))


# ── cache lookups ────────────────────────────────────────────────────────────────────────────


@final
@dataclass(slots=True)
class _OpenLookup:
    """A lookup's span, and the context token that made it current in the caller's task."""

    span: Span
    attached: contextvars.Token[Context]


@final
class LookupSpans:
    """The cache actor's LookupHook: one ``cache.lookup`` span for every lookup it serves.

    ``lookup_started`` runs in the caller's task before the request reaches the actor, so the
    span it makes current there is the parent of the flight's computation (which runs in a copy
    of that context); ``lookup_finished`` runs in the same task and restores the context.
    """

    __slots__ = ("_tracer",)

    def __init__(self, tracer: Tracer) -> None:
        self._tracer = tracer

    def lookup_started(self, tenant: str, key: str) -> object:
        span = self._tracer.start_span(
            "cache.lookup",
            attributes={
                "mmgate.cache.key": key_digest(key),
                "mmgate.cache.stage": current_stage(),
                "mmgate.cache.tenant": tenant,
            },
        )
        return _OpenLookup(span, otel_context.attach(trace.set_span_in_context(span)))

    def lookup_finished(self, token: object, event: LookupEvent) -> None:
        assert isinstance(token, _OpenLookup)
        otel_context.detach(token.attached)
        span = token.span
        attributes: dict[str, str | int | float] = {
            "mmgate.cache.outcome": lookup_outcome(event),
            "mmgate.cache.wait_ms": event.wait_seconds * 1000,
        }
        if event.tier is not None:
            attributes["mmgate.cache.tier"] = event.tier
        if event.nbytes is not None:
            attributes["mmgate.cache.bytes"] = event.nbytes
        if event.flight_id is not None:
            attributes["mmgate.cache.flight"] = event.flight_id
        # one call: the SDK takes the span's lock once per call (measured: 34 µs a span, not 56)
        span.set_attributes(attributes)
        leader = event.leader_token
        if event.outcome is Outcome.COALESCED and isinstance(leader, _OpenLookup):
            # the follower's wait is the leader's computation: the link leads there
            span.add_link(leader.span.get_span_context(), {"mmgate.cache.link": "leader"})
        error = event.error
        if error is not None:
            span.set_attribute("error.type", type(error).__qualname__)
            if not isinstance(error, asyncio.CancelledError):
                # the type only: a computation's message may quote the input
                span.set_status(Status(StatusCode.ERROR, type(error).__qualname__))
        span.end()


def lookup_outcome(event: LookupEvent) -> str:
    """hit | miss | coalesced | error | timeout | rejected | cancelled, as the metrics count."""
    if event.outcome is not None:
        return event.outcome.value
    if isinstance(event.error, ComputeTimeout | TimeoutError):
        return "timeout"
    if isinstance(event.error, CacheOverloaded | CacheRecursionError):
        return "rejected"
    if isinstance(event.error, asyncio.CancelledError):
        return "cancelled"  # the caller left (client gone, request deadline): nothing failed
    return "error"  # the computation failed, or the actor is gone


def key_digest(key: str) -> str:
    """A short prefix of the key's content digest; never the key's content."""
    head = key[:KEY_DIGITS]
    if len(key) >= KEY_DIGITS and all(c in "0123456789abcdef" for c in head):
        return head  # mmgate's keys are SHA-256 hex digests already
    return hashlib.sha256(key.encode()).hexdigest()[:KEY_DIGITS]


__all__ = [
    "ExportPlan",
    "LookupSpans",
    "RpcStatus",
    "Tracing",
    "export_plan",
    "key_digest",
    "lookup_outcome",
    "sampled_ratio",
    "service_name",
]
