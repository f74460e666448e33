"""A relayed call's servicer context in the core: what grpc.aio's context is to a handler, with
the call's messages and status going to its edge instead of a socket.

The core runs a relayed call through the same interceptors and servicer as a call of its own
(auth, parsing, metrics, tracing, the Inference servicer): they see this context where they would
see grpc.aio's, with the caller's metadata, deadline and address as the edge received them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Protocol, final

import grpc


class Outbox(Protocol):
    """Where a relayed call's messages and end go: its edge's next batch."""

    def message(self, call: int, data: bytes) -> None: ...


class Metadatum(NamedTuple):
    """One metadata entry, as grpc.aio hands a servicer one (a pair with names)."""

    key: str
    value: str | bytes


Metadata = tuple[Metadatum, ...]


@final
class RelayContext:
    """grpc.aio.ServicerContext's methods that mmgate's handlers, its interceptors and
    OpenTelemetry's use; nothing here blocks or touches a socket."""

    def __init__(
        self,
        outbox: Outbox,
        call: int,
        metadata: Metadata,
        timeout: float | None,
        peer: str,
    ) -> None:
        self._outbox, self.call = outbox, call
        self._metadata, self._peer = metadata, peer
        self._deadline = None if timeout is None else time.monotonic() + timeout
        self._code: grpc.StatusCode | None = None
        self._details: str | None = None
        self.trailing: Sequence[tuple[str, str | bytes]] = ()
        self._done = False
        self._callbacks: list[Callable[[Any], None]] = []

    # ── the call's messages ─────────────────────────────────────────────────────────────────

    async def write(self, message: Any) -> None:
        if self._done:
            raise grpc.aio.UsageError("the relayed call has ended")
        self._outbox.message(self.call, message.SerializeToString())

    async def send_initial_metadata(self, metadata: Any) -> None:
        return None  # the edge sends its own

    # ── what the caller sent ────────────────────────────────────────────────────────────────

    def invocation_metadata(self) -> Metadata:
        return self._metadata

    def time_remaining(self) -> float | None:
        if self._deadline is None:
            return None
        return max(self._deadline - time.monotonic(), 0.0)

    def peer(self) -> str:
        return self._peer

    def peer_identities(self) -> None:
        return None  # no client certificates reach a core through its edges

    def peer_identity_key(self) -> None:
        return None

    def auth_context(self) -> dict[str, list[bytes]]:
        return {}

    # ── how it ends ─────────────────────────────────────────────────────────────────────────

    async def abort(
        self,
        code: grpc.StatusCode,
        details: str = "",
        trailing_metadata: Sequence[tuple[str, str | bytes]] = (),
    ) -> None:
        self._code, self._details = code, details
        if trailing_metadata:
            self.trailing = tuple(trailing_metadata)
        raise grpc.aio.AbortError()

    async def abort_with_status(self, status: Any) -> None:
        await self.abort(status.code, status.details, status.trailing_metadata)

    def set_code(self, code: grpc.StatusCode) -> None:
        self._code = code

    def set_details(self, details: str) -> None:
        self._details = details

    def code(self) -> grpc.StatusCode | None:
        return self._code

    def details(self) -> str | None:
        return self._details

    def set_trailing_metadata(self, metadata: Sequence[tuple[str, str | bytes]]) -> None:
        self.trailing = tuple(metadata)

    def trailing_metadata(self) -> Sequence[tuple[str, str | bytes]]:
        return self.trailing

    def set_compression(self, compression: Any) -> None:
        return None

    def disable_next_message_compression(self) -> None:
        return None

    def add_done_callback(self, callback: Callable[[Any], None]) -> None:
        self._callbacks.append(callback)

    def cancelled(self) -> bool:
        return self._done and self._code is grpc.StatusCode.CANCELLED

    def done(self) -> bool:
        return self._done

    def finish(self) -> None:
        """The handler is over: no more writes; the done callbacks run."""
        self._done = True
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback(self)


__all__ = ["Metadata", "Metadatum", "Outbox", "RelayContext"]
