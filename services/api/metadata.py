"""What a call carries: a named metadata value, the trace context to hand on, its deadline. (Who
the caller is, and so its tenant, is the auth gate's to say: auth/gate.py.)"""

from __future__ import annotations

import time

import grpc

from ..wire import TRACE_HEADERS


def metadata_values(context: grpc.aio.ServicerContext, name: str) -> list[str]:
    """Every value the call's metadata gives ``name`` (a header may be sent more than once)."""
    return [
        value if isinstance(value, str) else value.decode()
        for key, value in context.invocation_metadata() or ()
        if key == name
    ]


def metadata_value(context: grpc.aio.ServicerContext, name: str) -> str | None:
    """The first value of ``name``, or None."""
    return next(iter(metadata_values(context, name)), None)


def trace_headers(context: grpc.aio.ServicerContext) -> dict[str, str]:
    """The client's W3C trace context (traceparent, tracestate), for the engine's own spans."""
    return {name: value for name in TRACE_HEADERS if (value := metadata_value(context, name))}


def call_deadline(context: grpc.aio.ServicerContext, default_seconds: float) -> float:
    """The call's deadline on ``time.monotonic()``'s clock (``default_seconds`` from now when the
    client set none): taken once, then handed down to every wait of the call."""
    remaining = context.time_remaining()
    return time.monotonic() + (default_seconds if remaining is None else remaining)


__all__ = ["call_deadline", "metadata_value", "metadata_values", "trace_headers"]
