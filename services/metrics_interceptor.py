"""The gRPC side of mmgate's metrics: one server interceptor that counts every call.

    call ─▶ in flight +1 ─▶ the method's own handler ─▶ in flight -1, duration, final code

The final code is the one the client sees: the handler's ``set_code`` or ``abort`` (which raises,
the code staying on the context), OK when it returns, CANCELLED when the client leaves,
DEADLINE_EXCEEDED when the deadline ends the call, UNKNOWN for an unhandled exception. Written
here rather than taken from ``grpcio-observability``, which pins an exact grpcio.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, final

import grpc
from prometheus_client import Counter, Gauge, Histogram

# A call with less than this left of its deadline when it was cancelled ran out of time.
_DEADLINE_SLACK_SECONDS = 0.001


@final
class MetricsInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Requests by method and final code, their duration, and the calls in progress."""

    def __init__(self, requests: Counter, duration: Histogram, in_flight: Gauge) -> None:
        self.requests = requests
        self.duration = duration
        self.in_flight = in_flight

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            # an unknown method: gRPC answers UNIMPLEMENTED; its name is the client's to choose,
            # so it is no label value
            return handler
        return self._wrap(handler, handler_call_details.method)

    def _wrap(self, handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
        kinds = {
            "unary_unary": grpc.unary_unary_rpc_method_handler,
            "unary_stream": grpc.unary_stream_rpc_method_handler,
            "stream_unary": grpc.stream_unary_rpc_method_handler,
            "stream_stream": grpc.stream_stream_rpc_method_handler,
        }
        for kind, make in kinds.items():
            behavior = getattr(handler, kind)
            if behavior is None:
                continue
            wrapped = self._wrap_behavior(behavior, method)
            if wrapped is None:
                return handler
            wrapper: grpc.RpcMethodHandler = make(
                wrapped,
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
            return wrapper
        return handler

    def _wrap_behavior(self, behavior: Any, method: str) -> Any:
        # grpc.aio tells the handler's form by the function's kind: keep it
        if inspect.isasyncgenfunction(behavior):

            async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
                observed = self._begin(method)
                error: BaseException | None = None
                try:
                    async for response in behavior(request, context):
                        yield response
                except BaseException as exc:
                    # GeneratorExit too: grpc stopped reading (the call was cancelled)
                    error = exc
                    raise
                finally:
                    self._end(observed, context, error)

            return stream
        if inspect.iscoroutinefunction(behavior):

            async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
                observed = self._begin(method)
                error: BaseException | None = None
                try:
                    return await behavior(request, context)
                except BaseException as exc:
                    error = exc
                    raise
                finally:
                    self._end(observed, context, error)

            return call
        # a synchronous handler (run in grpc's thread pool): mmgate registers none
        return None

    def _begin(self, method: str) -> tuple[str, float]:
        self.in_flight.labels(method).inc()
        return method, time.perf_counter()

    def _end(
        self,
        observed: tuple[str, float],
        context: grpc.aio.ServicerContext,
        error: BaseException | None,
    ) -> None:
        method, started = observed
        self.in_flight.labels(method).dec()
        self.duration.labels(method).observe(time.perf_counter() - started)
        self.requests.labels(method, final_code(context, error).name).inc()


def final_code(context: grpc.aio.ServicerContext, error: BaseException | None) -> grpc.StatusCode:
    """The status a call ends with, from its context and what its handler raised (if anything)."""
    code = context.code()
    if not isinstance(code, grpc.StatusCode):
        code = None
    if error is None:
        return code or grpc.StatusCode.OK
    if code is not None and code is not grpc.StatusCode.OK:
        # abort() and abort_with_status() raise, leaving their code on the context
        return code
    if isinstance(error, asyncio.CancelledError | GeneratorExit):
        remaining = context.time_remaining()
        if remaining is not None and remaining < _DEADLINE_SLACK_SECONDS:
            return grpc.StatusCode.DEADLINE_EXCEEDED
        return grpc.StatusCode.CANCELLED
    # what grpc answers for an exception its handler did not turn into a status
    return grpc.StatusCode.UNKNOWN
