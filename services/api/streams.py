"""Long-lived server streams (Cache.Watch, Inference.WatchLoad): each tenant's share of them,
and a client that has stopped reading.

    StreamSlots(kind, per_tenant).take(tenant) ─▶ release(), or RESOURCE_EXHAUSTED
        (TENANT_OVERLOADED): one greedy tenant cannot hold every stream a replica serves
    bounded_write(context, message, seconds) ─▶ TimeoutError once the write has waited that long
        (HTTP/2 flow control holds it while the client reads nothing)
    end_without_waiting(context, error): the status the call ends with, after what it was sent

Each stream's own handler writes its messages (not yielded to the interceptors, whose write is
unbounded), so that a write that waits is that handler's to bound.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, final

import grpc

from ..wire import TENANT_OVERLOADED
from .admission import count_down
from .status import ServiceError

__all__ = ["StreamSlots", "bounded_write", "end_without_waiting"]


@final
class StreamSlots:
    """Streams of one kind open now, by the caller's tenant (an admin's count as its own
    tenant's); a tenant leaves the map when its last one ends."""

    def __init__(self, kind: str, per_tenant: int) -> None:
        self.kind = kind  # as the refusal names them: "cache watchers"
        self.per_tenant = per_tenant
        self.by_tenant: dict[str, int] = {}
        self.open = 0

    def take(self, tenant: str) -> Callable[[], None]:
        """One of ``tenant``'s streams; the function returned gives it back.

        Raises:
            ServiceError: RESOURCE_EXHAUSTED (TENANT_OVERLOADED), the tenant's share open.
        """
        held = self.by_tenant.get(tenant, 0)
        if held >= self.per_tenant:
            raise ServiceError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"tenant {tenant} has {held} {self.kind} open, its limit; close one first",
                reason=TENANT_OVERLOADED,
            )
        self.by_tenant[tenant] = held + 1
        self.open += 1

        def release() -> None:
            self.open -= 1
            count_down(self.by_tenant, tenant)

        return release


async def bounded_write(context: grpc.aio.ServicerContext, message: Any, seconds: float) -> None:
    """``message`` written to the stream; TimeoutError once the write has waited ``seconds``."""
    async with asyncio.timeout(seconds):
        await context.write(message)


def end_without_waiting(context: grpc.aio.ServicerContext, error: ServiceError) -> None:
    """The status the call ends with once the handler returns, sent after the messages the
    client has yet to read; the handler does not wait for it (abort()'s status would wait
    behind them, and so would the handler)."""
    status = error.to_status()
    context.set_code(status.code)
    context.set_details(status.details)
    context.set_trailing_metadata(status.trailing_metadata)
