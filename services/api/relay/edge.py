"""A gRPC edge process: callers' calls in, the core's answers out, on a core of its own.

    caller ─▶ edge (shares the replica's port: SO_REUSEPORT)
                ├ Inference/Generate ─▶ CoreLink: RelayedCall on the edge's one Relay stream
                │     ◀─ RelayDown: every stream's messages of an engine step, written here
                └ every other method the core serves ─▶ passed through to the core's own
                      server (Unix socket) in its own shape: bytes, metadata and deadline as
                      the caller sent them; a method it does not serve: UNIMPLEMENTED here
A caller that leaves is a cancelled relayed call in the core (its engine request aborted); a
core that is gone ends every call UNAVAILABLE and the edge with it.

``python -m services.api.relay.edge`` reads what it needs as JSON on standard input (the core
starts it: services/api/relay/edges.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import signal
import sys
from collections.abc import AsyncIterator
from typing import Any, final

import grpc

from ...config import Settings
from ...observability.logs import configure_logging
from ...proto.mmgate.v1 import relay_pb2 as relay
from ...proto.mmgate.v1 import relay_pb2_grpc
from ..auth import certificate_files
from ..grpc_server import grpc_server, open_port, served_methods
from .core import UNLIMITED, metadata_of, metadata_pairs

log = logging.getLogger("mmgate.edge")

# the calls the core answers a batch an engine step; every other method is passed through
RELAYED = frozenset({"/mmgate.v1.Inference/Generate"})
STATUS = {code.value[0]: code for code in grpc.StatusCode}
GONE = relay.RelayEnd(code=grpc.StatusCode.UNAVAILABLE.value[0], details="the server is restarting")
# what a caller's metadata carries that is the connection's, not the call's
_HOP = ("user-agent", "te", "content-type")
# on SIGTERM (the core's, once it has drained): what an edge's callers have left to read
FLUSH_SECONDS = 1.0


def forwarded(metadata: Any) -> tuple[tuple[str, str | bytes], ...]:
    return tuple(
        (key, value)
        for key, value in metadata or ()
        if not key.startswith((":", "grpc-")) and key not in _HOP
    )


def status_metadata(metadata: Any) -> tuple[tuple[str, str | bytes], ...]:
    """A status's trailing metadata as the caller is to see it (google.rpc details included)."""
    return tuple(
        (key, value)
        for key, value in metadata or ()
        if not key.startswith(":") and key not in ("grpc-status", "grpc-message")
    )


@final
class CoreLink:
    """The edge's one Relay stream: calls opened and cancelled go up a batch at a time; each
    call's messages come down into its queue, its end last."""

    def __init__(self, socket: str) -> None:
        self._channel = grpc.aio.insecure_channel(f"unix:{socket}", options=UNLIMITED)
        self._calls: dict[int, asyncio.Queue[bytes | relay.RelayEnd]] = {}
        self._numbers = itertools.count(1)
        self._opened: list[relay.RelayedCall] = []
        self._cancelled: list[int] = []
        self._waiting = asyncio.Event()
        self.closed = asyncio.Event()
        self._reading: asyncio.Task[None] | None = None

    async def start(self) -> None:
        stream = relay_pb2_grpc.RelayStub(self._channel).Relay(self._ups())
        self._reading = asyncio.ensure_future(self._read(stream))

    async def _ups(self) -> AsyncIterator[relay.RelayUp]:
        yield relay.RelayUp()  # the core counts its edges by their first message
        while True:
            await self._waiting.wait()
            self._waiting.clear()
            up = relay.RelayUp(calls=self._opened, cancelled=self._cancelled)
            self._opened, self._cancelled = [], []
            yield up

    async def _read(self, stream: Any) -> None:
        calls = self._calls
        try:
            async for down in stream:
                for number, data in zip(down.calls, down.messages, strict=True):
                    if (queue := calls.get(number)) is not None:
                        queue.put_nowait(data)
                for end in down.ends:
                    if (queue := calls.pop(end.call, None)) is not None:
                        queue.put_nowait(end)
        except grpc.aio.AioRpcError as error:
            log.error("the core's relay ended: %s", error.code().name)
        finally:
            for queue in calls.values():
                queue.put_nowait(GONE)
            calls.clear()
            self.closed.set()

    def open(
        self, method: str, request: bytes, context: grpc.aio.ServicerContext
    ) -> tuple[int, asyncio.Queue[bytes | relay.RelayEnd]]:
        number, queue = next(self._numbers), asyncio.Queue[bytes | relay.RelayEnd]()
        if self.closed.is_set():
            queue.put_nowait(GONE)
            return number, queue
        self._calls[number] = queue
        self._opened.append(
            relay.RelayedCall(
                call=number,
                method=method,
                request=request,
                metadata=metadata_pairs(forwarded(context.invocation_metadata())),
                timeout_seconds=context.time_remaining() or 0.0,
                peer=context.peer(),
            )
        )
        self._waiting.set()
        return number, queue

    def cancel(self, number: int) -> None:
        if self._calls.pop(number, None) is not None:
            self._cancelled.append(number)
            self._waiting.set()

    async def close(self) -> None:
        if self._reading is not None:
            self._reading.cancel()
        await self._channel.close()


@final
class EdgeHandlers(grpc.GenericRpcHandler):
    """Every method the core serves: Generate relayed, the rest passed through as bytes, each
    in its own shape (a unary request read whole before it goes on); any other method is
    UNIMPLEMENTED here, as the core would answer it."""

    def __init__(self, link: CoreLink, core: grpc.aio.Channel) -> None:
        self._link, self._core = link, core
        self._handlers = {
            method: self._relaying(method) if method in RELAYED else self._passing(method, *shape)
            for method, shape in served_methods().items()
        }

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        return self._handlers.get(details.method)

    def _relaying(self, method: str) -> grpc.RpcMethodHandler:
        async def relayed(request: bytes, context: grpc.aio.ServicerContext) -> None:
            await self._relay(method, request, context)

        return grpc.unary_stream_rpc_method_handler(relayed)

    def _passing(
        self, method: str, streams_requests: bool, streams_responses: bool
    ) -> grpc.RpcMethodHandler:
        core = self._core
        if not streams_requests and not streams_responses:

            async def unary(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
                async with _status_of(context):
                    response: bytes = await core.unary_unary(method)(request, **_call(context))
                    return response

            return grpc.unary_unary_rpc_method_handler(unary)
        if not streams_requests:

            async def stream(request: bytes, context: grpc.aio.ServicerContext) -> None:
                call = core.unary_stream(method)(request, **_call(context))
                try:
                    async with _status_of(context):
                        async for response in call:
                            await context.write(response)
                finally:
                    call.cancel()

            return grpc.unary_stream_rpc_method_handler(stream)

        async def both(requests: Any, context: grpc.aio.ServicerContext) -> None:
            call = core.stream_stream(method)(**_call(context))
            # the caller's messages written by a task of this call's own, stopped before the
            # call ends (grpc.aio's own reader of a request iterator outlives a finished call)
            pumping = asyncio.ensure_future(_pump(requests, call))
            try:
                async with _status_of(context):
                    while (response := await call.read()) is not grpc.aio.EOF:
                        await context.write(response)
            finally:
                pumping.cancel()
                await asyncio.gather(pumping, return_exceptions=True)
                call.cancel()

        return grpc.stream_stream_rpc_method_handler(both)

    async def _relay(self, method: str, request: bytes, context: grpc.aio.ServicerContext) -> None:
        number, queue = self._link.open(method, request, context)
        ended = False
        try:
            while True:
                item = await queue.get()
                if isinstance(item, bytes):
                    await context.write(item)
                    continue
                ended = True
                trailing = metadata_of(item.trailing)
                code = STATUS.get(item.code, grpc.StatusCode.UNKNOWN)
                if code is not grpc.StatusCode.OK:
                    await context.abort(code, item.details, trailing)
                if trailing:
                    context.set_trailing_metadata(trailing)
                return
        finally:
            if not ended:  # the caller left, or its deadline passed: the core stops its work
                self._link.cancel(number)


def _call(context: grpc.aio.ServicerContext) -> dict[str, Any]:
    """The caller's metadata and deadline, for the core."""
    return {
        "metadata": forwarded(context.invocation_metadata()),
        "timeout": context.time_remaining(),
    }


@contextlib.asynccontextmanager
async def _status_of(context: grpc.aio.ServicerContext) -> AsyncIterator[None]:
    """The core's status for a passed call is the caller's, details and trailers too."""
    try:
        yield
    except grpc.aio.AioRpcError as error:
        await context.abort(
            error.code(), error.details() or "", status_metadata(error.trailing_metadata())
        )


async def _pump(requests: AsyncIterator[bytes], call: Any) -> None:
    """The caller's messages to the core, then the end of them."""
    try:
        async for request in requests:
            await call.write(request)
        await call.done_writing()
    except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
        return  # the core's call has ended: its status is the caller's


async def run_edge(settings: Settings, relay_socket: str, core_socket: str) -> int:
    """Serve until SIGTERM (then the calls in flight finish) or until the core is gone."""
    link = CoreLink(relay_socket)
    core = grpc.aio.insecure_channel(f"unix:{core_socket}", options=UNLIMITED)
    server = grpc_server(settings, [], shared_port=True)
    server.add_generic_rpc_handlers((EdgeHandlers(link, core),))
    open_port(server, settings, certificate_files(settings.auth))
    await link.start()
    await server.start()
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    ended = asyncio.ensure_future(link.closed.wait())
    asked = asyncio.ensure_future(stopping.wait())
    await asyncio.wait((ended, asked), return_when=asyncio.FIRST_COMPLETED)
    await server.stop(FLUSH_SECONDS if asked.done() else 0)
    for waiting in (ended, asked):
        waiting.cancel()
    await link.close()
    await core.close()
    return 0 if asked.done() else 1


def main() -> int:
    given = json.loads(sys.stdin.read())
    settings = Settings.model_validate(given["settings"])
    configure_logging(settings.log_level, settings.log_format)
    return asyncio.run(run_edge(settings, given["relay"], given["core"]))


if __name__ == "__main__":
    sys.exit(main())
