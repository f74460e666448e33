"""The core process's side of the relay: the calls its edges relay, run as its own, and each
edge's messages sent to it a batch at a time.

    edge ─ RelayUp(calls, cancelled) ─▶ Relay(): a task per call ─▶ the interceptors ─▶ the handler
                                         (RelayContext: metadata, deadline, peer from the edge)
    edge ◀─ RelayDown(calls[i], messages[i] ..., ends) ◀─ EdgeBatch: what every call wrote
                                                          since the last send, in one message

Whatever the engine's outputs of one step make (a message per stream) leaves in one RelayDown: the
core writes one gRPC message per edge and step, not one per stream and token, and the edges pay
for the callers' streams on cores of their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from functools import partial
from typing import Any, NamedTuple, final

import grpc

from ...proto.mmgate.v1 import inference_pb2_grpc, relay_pb2_grpc
from ...proto.mmgate.v1 import relay_pb2 as relay
from .context import Metadata, Metadatum, RelayContext

log = logging.getLogger("mmgate.relay")

# the relay's messages are a batch of the callers' (each within the callers' own limits)
UNLIMITED = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]

Continuation = Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler | None]]


class _CallDetails(NamedTuple):
    """grpc.HandlerCallDetails, for the interceptors."""

    method: str
    invocation_metadata: Metadata


@final
class Registry:
    """The method handlers a servicer registers with a server, kept for relayed calls."""

    def __init__(self) -> None:
        self.handlers: dict[str, grpc.RpcMethodHandler] = {}

    def add_generic_rpc_handlers(self, handlers: Sequence[Any]) -> None:
        return None  # the registered ones below are the same handlers

    def add_registered_method_handlers(
        self, service: str, handlers: dict[str, grpc.RpcMethodHandler]
    ) -> None:
        for name, handler in handlers.items():
            self.handlers[f"/{service}/{name}"] = handler


def relayed_handlers(inference: inference_pb2_grpc.InferenceServicer) -> Registry:
    """The Inference service's handlers, as its generated code registers them."""
    registry = Registry()
    inference_pb2_grpc.add_InferenceServicer_to_server(inference, registry)
    return registry


def _intercepted(
    interceptors: Sequence[grpc.aio.ServerInterceptor], registry: Registry
) -> Continuation:
    """A method's handler through the interceptors, outermost first, as grpc.aio's server
    applies them to a call of its own."""

    async def found(details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        return registry.handlers.get(details.method)

    continuation: Continuation = found
    for interceptor in reversed(interceptors):

        async def through(
            details: grpc.HandlerCallDetails,
            interceptor: grpc.aio.ServerInterceptor = interceptor,
            inner: Continuation = continuation,
        ) -> grpc.RpcMethodHandler | None:
            return await interceptor.intercept_service(inner, details)

        continuation = through
    return continuation


def metadata_of(metadata: Sequence[relay.MetadataPair]) -> Metadata:
    return tuple(
        Metadatum(pair.key, pair.value if pair.key.endswith("-bin") else pair.value.decode())
        for pair in metadata
    )


def metadata_pairs(metadata: Sequence[tuple[str, str | bytes]]) -> list[relay.MetadataPair]:
    return [
        relay.MetadataPair(key=key, value=value if isinstance(value, bytes) else value.encode())
        for key, value in metadata
    ]


@final
class EdgeBatch:
    """What one edge's calls wrote since the last send: sent as one RelayDown once the loop has
    run every task this wake-up made ready (an engine step's outputs, for all streams)."""

    def __init__(self, context: grpc.aio.ServicerContext) -> None:
        self._context = context
        self._calls: list[int] = []
        self._messages: list[bytes] = []
        self._ends: list[relay.RelayEnd] = []
        self._waiting = asyncio.Event()

    def message(self, call: int, data: bytes) -> None:
        self._calls.append(call)
        self._messages.append(data)
        self._waiting.set()

    def end(
        self,
        call: int,
        code: grpc.StatusCode,
        details: str,
        trailing: Sequence[tuple[str, str | bytes]],
    ) -> None:
        self._ends.append(
            relay.RelayEnd(
                call=call, code=code.value[0], details=details, trailing=metadata_pairs(trailing)
            )
        )
        self._waiting.set()

    async def send(self) -> None:
        """Until cancelled: each batch as soon as there is one and the last has been written."""
        while True:
            await self._waiting.wait()
            self._waiting.clear()
            down = relay.RelayDown(calls=self._calls, messages=self._messages, ends=self._ends)
            self._calls, self._messages, self._ends = [], [], []
            await self._context.write(down)


async def _answer(handler: grpc.RpcMethodHandler, data: bytes, context: RelayContext) -> None:
    """A server-streaming handler's answer to the request's bytes, written to the context."""
    result = handler.unary_stream(handler.request_deserializer(data), context)
    if inspect.isasyncgen(result):  # an interceptor's wrapper, or a handler that yields
        async for message in result:
            if message is not None:
                await context.write(message)
    else:
        await result


def _forget(calls: dict[int, asyncio.Task[None]], number: int, _: object) -> None:
    calls.pop(number, None)


def _status(context: RelayContext, error: BaseException | None) -> tuple[grpc.StatusCode, str]:
    code = context.code()
    if isinstance(code, grpc.StatusCode):
        return code, context.details() or ""
    if error is None:
        return grpc.StatusCode.OK, ""
    return grpc.StatusCode.UNKNOWN, "the server failed to answer"


@final
class RelayServicer(relay_pb2_grpc.RelayServicer):
    """The core's end of every edge's Relay stream."""

    def __init__(
        self, interceptors: Sequence[grpc.aio.ServerInterceptor], registry: Registry
    ) -> None:
        self._handler = _intercepted(interceptors, registry)
        self.edges = 0  # edges connected now
        self.connected = asyncio.Condition()

    async def Relay(
        self, requests: AsyncIterator[relay.RelayUp], context: grpc.aio.ServicerContext
    ) -> None:
        batch = EdgeBatch(context)
        sending = asyncio.ensure_future(batch.send())
        calls: dict[int, asyncio.Task[None]] = {}
        async with self.connected:
            self.edges += 1
            self.connected.notify_all()
        try:
            async for up in requests:
                for call in up.calls:
                    task = asyncio.ensure_future(self._run(call, batch))
                    calls[call.call] = task
                    task.add_done_callback(partial(_forget, calls, call.call))
                for number in up.cancelled:
                    if (running := calls.get(number)) is not None:
                        running.cancel()
        finally:
            # the edge is gone (or the core stops): nobody is left to answer
            for task in list(calls.values()):
                task.cancel()
            await asyncio.gather(*calls.values(), return_exceptions=True)
            sending.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sending
            async with self.connected:
                self.edges -= 1
                self.connected.notify_all()

    async def _run(self, call: relay.RelayedCall, batch: EdgeBatch) -> None:
        metadata = metadata_of(call.metadata)
        context = RelayContext(batch, call.call, metadata, call.timeout_seconds or None, call.peer)
        error: BaseException | None = None
        try:
            handler = await self._handler(_CallDetails(call.method, metadata))
            if handler is None or handler.unary_stream is None:
                context.set_code(grpc.StatusCode.UNIMPLEMENTED)
                context.set_details("this method is not relayed")
            else:
                # the caller's deadline, kept here too: an edge's cancellation may never come
                async with asyncio.timeout(call.timeout_seconds or None):
                    await _answer(handler, call.request, context)
        except grpc.aio.AbortError:
            pass
        except TimeoutError:
            context.set_code(grpc.StatusCode.DEADLINE_EXCEEDED)
            context.set_details("the call's deadline passed")
        except asyncio.CancelledError:
            return  # the caller left (or its edge did): no end to send
        except Exception as exc:  # ended as gRPC would end it, and logged
            error = exc
            log.exception("a relayed call failed")
        finally:
            context.finish()
        code, details = _status(context, error)
        batch.end(call.call, code, details, context.trailing)


def relay_server(relay: RelayServicer, socket: str) -> grpc.aio.Server:
    """The Relay service on its Unix socket (no interceptors: a relayed call meets them in
    RelayServicer; nobody but this user's edges reaches the socket)."""
    server = grpc.aio.server(options=UNLIMITED)
    relay_pb2_grpc.add_RelayServicer_to_server(relay, server)
    server.add_insecure_port(f"unix:{socket}")
    return server


__all__ = [
    "UNLIMITED",
    "EdgeBatch",
    "Registry",
    "RelayServicer",
    "metadata_of",
    "metadata_pairs",
    "relay_server",
]
