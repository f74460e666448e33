"""The gRPC side of mmgate's metrics: one server interceptor that counts every call.

    call ─▶ in flight +1 ─▶ the method's own handler ─▶ in flight -1, duration, final code

The final code is the one the client sees (wrapping.final_status, the same rule the server spans
follow). Written here rather than taken from ``grpcio-observability``, which pins an exact grpcio.
"""

from __future__ import annotations

import time
from typing import final

from prometheus_client import Counter, Gauge, Histogram

from ...observability.metrics import Metrics
from .wrapping import FinalStatus, WatchingInterceptor


def metrics_interceptors(metrics: Metrics) -> list[MetricsInterceptor]:
    """The interceptor counting into ``metrics``' gRPC families; none when metrics are off."""
    if not metrics.enabled:
        return []
    return [
        MetricsInterceptor(metrics.grpc_requests, metrics.grpc_duration, metrics.grpc_in_flight)
    ]


@final
class MetricsInterceptor(WatchingInterceptor):
    """Requests by method and final code, their duration, and the calls in progress."""

    def __init__(self, requests: Counter, duration: Histogram, in_flight: Gauge) -> None:
        self.requests = requests
        self.duration = duration
        self.in_flight = in_flight

    def begin(self, method: str) -> object:
        self.in_flight.labels(method).inc()
        return method, time.perf_counter()

    def end(self, token: object, status: FinalStatus) -> None:
        assert isinstance(token, tuple)
        method, started = token
        self.in_flight.labels(method).dec()
        self.duration.labels(method).observe(time.perf_counter() - started)
        self.requests.labels(method, status.code.name).inc()


__all__ = ["MetricsInterceptor", "metrics_interceptors"]
