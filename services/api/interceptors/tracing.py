"""Server spans: OpenTelemetry's aio instrumentation, and what it gets wrong put right.

    gRPC call ─▶ OpenTelemetryAioServerInterceptor   server span "/mmgate.v1.Inference/Complete",
                                                     child of the client's traceparent
              ─▶ RpcStatus                           the call's real final status on that span;
                                                     CURRENT_TRACER set for the call's task
              ─▶ metrics interceptor ─▶ servicer

What opentelemetry-instrumentation-grpc 0.66b2 gets wrong on grpc.aio, and RpcStatus puts right
(it runs inside the instrumentation's span, so that span is current there):

- a client-cancelled or deadline-exceeded call ends the handler with CancelledError, which the
  instrumentation lets through without a status: the span said UNSET and rpc.grpc.status_code 0
  (OK). RpcStatus records CANCELLED, or DEADLINE_EXCEEDED when the deadline had passed.
- ``context.abort_with_status()`` (services/api/status.py's only way out) is not hooked, and the
  statuses it does see it maps by the semantic conventions' server table, where INVALID_ARGUMENT
  or NOT_FOUND stay UNSET. RpcStatus reads the call's final code (wrapping.final_status) and
  marks every non-OK code ERROR with "CODE: details": an operator searching for failed calls
  finds them.
- a streaming handler that writes with ``context.write()`` (Generate does) fails with "'async for'
  requires an object with __aiter__": the instrumentation iterates whatever the handler returns.
  The shared wrapper awaits such a handler, and writes a generator handler's messages itself, so
  the instrumentation's generator never yields and a cancellation always lands inside the handler.
"""

from __future__ import annotations

from typing import Any, final

import grpc
from opentelemetry import trace
from opentelemetry.trace import Span, Status, StatusCode, Tracer

from ...observability.spans import CURRENT_TRACER
from ...observability.tracing import Tracing
from .wrapping import FinalStatus, WatchingInterceptor


def tracing_interceptors(tracing: Tracing) -> list[Any]:
    """Outermost first: the instrumentation's server span, then mmgate's status fixes."""
    if tracing.provider is None or tracing.tracer is None:
        return []
    from opentelemetry.instrumentation.grpc import aio_server_interceptor, filters

    traced = filters.negate(filters.health_check())  # health checks are not traced
    return [
        aio_server_interceptor(  # type: ignore[no-untyped-call]
            tracer_provider=tracing.provider, filter_=traced
        ),
        RpcStatus(tracing.tracer, traced),
    ]


@final
class RpcStatus(WatchingInterceptor):
    """Inside the instrumentation's server span: the call's real final status, and the tracer."""

    def __init__(self, tracer: Tracer, traced: Any) -> None:
        self._tracer = tracer
        self._traced = traced

    def wants(self, call: grpc.HandlerCallDetails) -> bool:
        return bool(self._traced(call))

    def begin(self, method: str) -> object:
        # the call runs in its own task: the variable goes with it, and so do its children
        CURRENT_TRACER.set(self._tracer)
        return trace.get_current_span()

    def end(self, token: object, status: FinalStatus) -> None:
        assert isinstance(token, Span)
        code = status.code
        if code is grpc.StatusCode.OK or not token.is_recording():
            return
        token.set_attribute("rpc.grpc.status_code", code.value[0])
        message = f"{code.name}: {status.details}" if status.details else code.name
        token.set_status(Status(StatusCode.ERROR, message))


__all__ = ["RpcStatus", "tracing_interceptors"]
