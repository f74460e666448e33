"""What the service shows of itself: traces, metrics, health."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class TracingSettings(BaseModel):
    """OpenTelemetry traces, exported over OTLP (Jaeger ingests it natively). The standard
    ``OTEL_*`` variables apply where these are unset (docs/observability.md)."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    endpoint: str | None = None
    """OTLP endpoint (grpc: host:port; http: its URL); unset: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT
    or OTEL_EXPORTER_OTLP_ENDPOINT, and with neither, no tracing at all (nothing recorded)."""
    protocol: Literal["grpc", "http/protobuf"] | None = None
    """OTLP transport; unset: OTEL_EXPORTER_OTLP_TRACES_PROTOCOL / OTEL_EXPORTER_OTLP_PROTOCOL,
    else grpc."""
    sample_ratio: float | None = Field(None, ge=0, le=1)
    """Share of new traces recorded (a client's sampled traceparent is always followed); unset:
    OTEL_TRACES_SAMPLER_ARG, else 1."""
    service_name: str | None = None
    """service.name of the spans; unset: OTEL_SERVICE_NAME, else "mmgate"."""


class MetricsSettings(BaseModel):
    """Prometheus metrics, served on their own HTTP port at /metrics."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    enabled: bool = True
    """Serve /metrics."""
    host: str = "127.0.0.1"
    """Address of the metrics HTTP server."""
    port: int = Field(9464, ge=0, le=65535)
    """Port of the metrics HTTP server (0: any free port)."""
    read_timeout_seconds: float = Field(10.0, gt=0)
    """A connection that has not sent its request (or read the answer) in this long is closed."""
    max_connections: int = Field(64, gt=0)
    """Open connections to the metrics port beyond this are closed at once."""


class LoadSettings(BaseModel):
    """Inference.WatchLoad: the load streams routers keep open (GetLoad, polled, holds none)."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    max_watchers: int = Field(16, gt=0)
    """WatchLoad streams open at once, all callers together; one more is refused with
    RESOURCE_EXHAUSTED (poll GetLoad instead)."""
    max_watchers_per_tenant: int = Field(4, gt=0)
    """WatchLoad streams one tenant may have open at once, within max_watchers (an admin's count
    as its own tenant's); one more is refused with RESOURCE_EXHAUSTED."""
    watch_idle_seconds: float = Field(30.0, gt=0)
    """A WatchLoad stream whose client has taken nothing for this long while a load waits to be
    sent to it (it stopped reading: HTTP/2 flow control holds the write) is ended, its slot given
    back: its stream ends, after what it was sent, with RESOURCE_EXHAUSTED."""


class HealthSettings(BaseModel):
    """What turns health NOT_SERVING, and how soon (see docs/service.md, "Health and shutdown")."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    interval_seconds: float = Field(1.0, gt=0)
    """How often health is re-evaluated (the actor pinged, the engine's progress read)."""
    engine_stall_seconds: float = Field(20.0, gt=0)
    """Requests in flight and no engine step for this long: readiness NOT_SERVING until steps
    resume."""
    engine_hung_seconds: float = Field(120.0, gt=0)
    """No engine step for this long with requests in flight: liveness fails (as it does at
    once when the engine has died), so the orchestrator restarts the pod."""
    loop_block_seconds: float = Field(2.0, gt=0)
    """The event loop has not answered the heartbeat thread for this long: logged with the
    stack it is stuck in, and readiness NOT_SERVING."""
    loop_recover_seconds: float = Field(5.0, ge=0)
    """Readiness stays NOT_SERVING this long after a blocked loop moves again."""


__all__ = ["HealthSettings", "LoadSettings", "MetricsSettings", "TracingSettings"]
