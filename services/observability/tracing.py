"""OpenTelemetry traces: the provider and OTLP exporter, and one span per cache lookup.

    gRPC call ─▶ the API's tracing interceptors      server span, and CURRENT_TRACER set for the
                 (services/api/interceptors)         call (they take this object's provider)
    cache.get ─▶ LookupSpans.lookup_started          "cache.lookup", made current in the caller's
                                                     task: the flight's computation is its child
              ─▶ LookupSpans.lookup_finished         outcome, tier, wait, bytes; a coalesced
                                                     lookup links to its leader's span
    spans ─▶ BatchSpanProcessor ─▶ OTLP exporter (gRPC or HTTP/protobuf) ─▶ collector, Jaeger

With no endpoint (settings or ``OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT``) nothing is installed: no
provider, no interceptor, no lookup hook; the span helpers (spans.py) then cost one
context-variable read each.
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import logging
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Literal, final
from urllib.parse import urlsplit

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, Status, StatusCode, Tracer

from cache_actor import LookupEvent, LookupHook, Outcome, Stage

from ..config import Settings, TracingSettings
from ..keys import is_hex_key
from .lookups import lookup_outcome, stage_label
from .spans import flush_pending, later

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

    async def force_flush(self, timeout: float = SHUTDOWN_SECONDS) -> bool:
        """Export every ended span now (off the loop: the exporter blocks)."""
        provider = self.provider
        if provider is None:
            return True
        flush_pending()
        return await asyncio.to_thread(provider.force_flush, int(timeout * 1000))

    async def shutdown(self) -> None:
        """Flush and close the exporter; spans ended later are dropped."""
        provider, self.provider = self.provider, None
        if provider is None:
            return
        flush_pending()
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

    def lookup_started(self, tenant: str, key: str, stage: Stage) -> object:
        span = self._tracer.start_span(
            "cache.lookup",
            attributes={
                "mmgate.cache.key": key_digest(key),
                "mmgate.cache.stage": stage_label(stage),
                "mmgate.cache.tenant": tenant,
            },
        )
        return _OpenLookup(span, otel_context.attach(trace.set_span_in_context(span)))

    def lookup_finished(self, token: object, event: LookupEvent) -> None:
        assert isinstance(token, _OpenLookup)
        otel_context.detach(token.attached)  # now: the caller's context is restored at once
        ended_ns = time.time_ns()
        later(lambda: _record_lookup(token, event, ended_ns))


def _record_lookup(token: _OpenLookup, event: LookupEvent, ended_ns: int) -> None:
    """A finished lookup's attributes and end, when the loop is free (spans.later)."""
    span = token.span
    attributes: dict[str, str | int | float] = {
        "mmgate.cache.outcome": lookup_outcome(event),
        "mmgate.cache.wait_ms": event.wait_seconds * 1000,
    }
    if event.tier is not None:
        attributes["mmgate.cache.tier"] = event.tier
    if event.tier_failure is not None:
        # the second tier was asked and failed: the value was computed instead
        attributes["mmgate.cache.tier"], attributes["mmgate.cache.tier_outcome"] = (
            event.tier_failure
        )
    if event.nbytes is not None:
        attributes["mmgate.cache.bytes"] = event.nbytes
    if event.flight_id is not None:
        attributes["mmgate.cache.flight"] = event.flight_id
    # one call: the SDK takes the span's lock once per call, not once per attribute
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
    span.end(end_time=ended_ns)


def key_digest(key: str) -> str:
    """A short prefix of the key's content digest; never the key's content."""
    head = key[:KEY_DIGITS]
    if len(head) == KEY_DIGITS and is_hex_key(head):
        return head  # mmgate's keys are SHA-256 hex digests already
    return hashlib.sha256(key.encode()).hexdigest()[:KEY_DIGITS]


__all__ = [
    "ExportPlan",
    "LookupSpans",
    "Tracing",
    "export_plan",
    "key_digest",
    "sampled_ratio",
    "service_name",
]
