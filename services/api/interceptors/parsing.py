"""Bytes that are not the method's message: INVALID_ARGUMENT in mmgate's words, for every RPC.

    request bytes ─▶ the method's deserializer ─ parsed ─▶ the handler, as before
                                               └ fails ─▶ Unparseable ─▶ abort(INVALID_ARGUMENT)

grpc.aio answers a deserializer's exception with UNKNOWN and the exception's class in the
details. Here the deserializer cannot fail: it hands the handler an ``Unparseable`` marker
instead, and the wrapped handler ends the call with a status of mmgate's own before the servicer
sees anything. Innermost of the interceptors, so tracing and metrics see that status.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, final

import grpc

from ..status import ServiceError, abort

MESSAGE = "the request is not a valid protobuf message for this method"


@final
class Unparseable:
    """What the deserializer returns for bytes it cannot parse."""

    __slots__ = ()


UNPARSEABLE = Unparseable()


def _refusal() -> ServiceError:
    return ServiceError(grpc.StatusCode.INVALID_ARGUMENT, MESSAGE)


def _deserializer(parse: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    if parse is None:
        return None

    def deserialize(data: bytes) -> Any:
        try:
            return parse(data)
        except Exception:  # noqa: BLE001 - any parse failure is the client's bytes
            return UNPARSEABLE

    return deserialize


async def _checked(
    requests: AsyncIterator[Any], context: grpc.aio.ServicerContext
) -> AsyncIterator[Any]:
    async for request in requests:
        if request is UNPARSEABLE:
            await abort(context, _refusal())
        yield request


async def _responses(responses: Any) -> AsyncIterator[Any]:
    """A streaming behavior's messages: it yields them, or writes them itself and returns."""
    if hasattr(responses, "__aiter__"):
        async for response in responses:
            yield response
    else:
        await responses


def _unary_unary(behavior: Callable[..., Any]) -> Callable[..., Any]:
    async def handle(request: Any, context: grpc.aio.ServicerContext) -> Any:
        if request is UNPARSEABLE:
            await abort(context, _refusal())
        return await behavior(request, context)

    return handle


def _unary_stream(behavior: Callable[..., Any]) -> Callable[..., Any]:
    async def handle(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        if request is UNPARSEABLE:
            await abort(context, _refusal())
        async for response in _responses(behavior(request, context)):
            yield response

    return handle


def _stream_unary(behavior: Callable[..., Any]) -> Callable[..., Any]:
    async def handle(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
        return await behavior(_checked(requests, context), context)

    return handle


def _stream_stream(behavior: Callable[..., Any]) -> Callable[..., Any]:
    async def handle(
        requests: AsyncIterator[Any], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[Any]:
        async for response in _responses(behavior(_checked(requests, context), context)):
            yield response

    return handle


class ParsingInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        deserializer = _deserializer(handler.request_deserializer)
        serializer = handler.response_serializer
        made: grpc.RpcMethodHandler
        if handler.request_streaming and handler.response_streaming:
            made = grpc.stream_stream_rpc_method_handler(
                _stream_stream(handler.stream_stream), deserializer, serializer
            )
        elif handler.request_streaming:
            made = grpc.stream_unary_rpc_method_handler(
                _stream_unary(handler.stream_unary), deserializer, serializer
            )
        elif handler.response_streaming:
            made = grpc.unary_stream_rpc_method_handler(
                _unary_stream(handler.unary_stream), deserializer, serializer
            )
        else:
            made = grpc.unary_unary_rpc_method_handler(
                _unary_unary(handler.unary_unary), deserializer, serializer
            )
        return made


__all__ = ["MESSAGE", "ParsingInterceptor", "Unparseable"]
