"""One way to watch a gRPC call, shared by every interceptor: begin, the handler, end.

    intercept_service ─▶ wants(call)? ─ no ─▶ the handler as it is
                                      └ yes ─▶ watched(handler): begin(method) ─▶ admit(context)
                                                   ─▶ the handler (a stream's messages written
                                                      here with context.write())
                                               ─▶ end(token, final_status(context, error))

``final_status`` is the one rule for how a call ended, so a span and a metric never disagree
about the same call: the code the handler set (``abort``, ``abort_with_status`` and ``set_code``
leave it on the context; abort also raises), OK when it returned, DEADLINE_EXCEEDED when a
cancellation came with the deadline (all but) spent, CANCELLED for any other cancellation,
UNKNOWN for an exception no status was made of (what gRPC answers then).

A stream's messages are written here rather than yielded: a generator suspended at a yield is not
where a cancellation lands, so its end would be seen late or never. The wrapper is an async
generator that yields nothing, which is what an outer interceptor (OpenTelemetry's) iterates.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, final

import grpc

# A call cancelled with less than this left of its deadline ran out of time.
DEADLINE_SLACK_SECONDS = 0.001

Behavior = Callable[[Any, Any], Any]


@final
@dataclass(frozen=True, slots=True)
class FinalStatus:
    code: grpc.StatusCode
    details: str = ""


def final_status(context: grpc.aio.ServicerContext, error: BaseException | None) -> FinalStatus:
    """The status a call ends with, from its context and what its handler raised (if anything)."""
    code = context.code()
    if isinstance(code, grpc.StatusCode) and code is not grpc.StatusCode.OK:
        details = context.details()
        if isinstance(details, bytes):
            details = details.decode(errors="replace")
        return FinalStatus(code, details or "")
    if error is None:
        return FinalStatus(grpc.StatusCode.OK)
    if isinstance(error, asyncio.CancelledError | GeneratorExit):
        remaining = context.time_remaining()
        if remaining is not None and remaining < DEADLINE_SLACK_SECONDS:
            return FinalStatus(grpc.StatusCode.DEADLINE_EXCEEDED)
        return FinalStatus(grpc.StatusCode.CANCELLED)
    return FinalStatus(grpc.StatusCode.UNKNOWN, type(error).__qualname__)


class WatchingInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """An interceptor that sees each call it wants begin and end, and nothing else."""

    def wants(self, call: grpc.HandlerCallDetails) -> bool:
        return True

    async def admit(self, context: grpc.aio.ServicerContext) -> None:
        """Before the handler, in its task: may end the call (``context.abort``) or set context
        variables the handler reads (the authenticated caller)."""
        return None

    def begin(self, method: str) -> object:
        """At the call's start, in its task; the token is handed to end()."""
        raise NotImplementedError

    def end(self, token: object, status: FinalStatus) -> None:
        raise NotImplementedError

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        # an unknown method (None): gRPC answers UNIMPLEMENTED, and its name is the client's to
        # choose, so no label value or span name is made of it
        if handler is None or not self.wants(handler_call_details):
            return handler
        return watched(handler, handler_call_details.method, self)


def watched(
    handler: grpc.RpcMethodHandler, method: str, watch: WatchingInterceptor
) -> grpc.RpcMethodHandler:
    """``handler`` with ``watch.begin`` before and ``watch.end`` after each call."""
    if handler.response_streaming:
        behavior = handler.stream_stream if handler.request_streaming else handler.unary_stream
        factory = (
            grpc.stream_stream_rpc_method_handler
            if handler.request_streaming
            else grpc.unary_stream_rpc_method_handler
        )
        wrapped: Behavior = _stream(behavior, method, watch)
    else:
        behavior = handler.stream_unary if handler.request_streaming else handler.unary_unary
        factory = (
            grpc.stream_unary_rpc_method_handler
            if handler.request_streaming
            else grpc.unary_unary_rpc_method_handler
        )
        wrapped = _unary(behavior, method, watch)
    made: grpc.RpcMethodHandler = factory(
        wrapped,
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )
    return made


def _unary(behavior: Behavior, method: str, watch: WatchingInterceptor) -> Behavior:
    async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
        token = watch.begin(method)
        try:
            await watch.admit(context)
            response = behavior(request, context)
            if inspect.isawaitable(response):
                response = await response
        except BaseException as exc:
            watch.end(token, final_status(context, exc))
            raise
        watch.end(token, final_status(context, None))
        return response

    return unary


def _stream(behavior: Behavior, method: str, watch: WatchingInterceptor) -> Behavior:
    async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        token = watch.begin(method)
        try:
            await watch.admit(context)
            responses = behavior(request, context)
            if hasattr(responses, "__aiter__"):
                async for response in responses:
                    await context.write(response)
            elif inspect.isawaitable(responses):
                await responses  # the handler writes with context.write() itself
            else:
                for response in responses:
                    await context.write(response)
        except BaseException as exc:
            watch.end(token, final_status(context, exc))
            raise
        watch.end(token, final_status(context, None))
        return
        yield  # an async generator that yields nothing

    return stream


__all__ = ["FinalStatus", "WatchingInterceptor", "final_status", "watched"]
