"""Inference.Abort: the calls being answered, by tenant and request id, and ending them.

    Generate / Complete ─ async with calls.answering(tenant, request_id): ─▶ its work
    Abort(ids) ─▶ calls.abort(tenant, ids) ─▶ each call's task cancelled, marked aborted
        ─▶ in that call: the cancellation closes its streams down to the engine's (vLLM aborts
           the run; a response shared with others runs on for them), as a caller leaving does
        ─▶ answering() takes the cancellation back (Task.uncancel) and raises RequestAborted:
           the call ends with CANCELLED (REQUEST_ABORTED) in mmgate's words

Only a call's own tenant can reach it: another tenant's id is as unknown as one nobody sent.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable
from typing import final

from ..errors import RequestAborted, RequestNotFound

__all__ = ["AnsweredCalls"]


@final
class AnsweredCalls:
    """The calls being answered that named a request id, by (tenant, request id)."""

    __slots__ = ("_aborted", "_calls")

    def __init__(self) -> None:
        self._calls: dict[tuple[str, str], set[asyncio.Task[object]]] = {}
        self._aborted: set[asyncio.Task[object]] = set()

    @contextlib.asynccontextmanager
    async def answering(self, tenant: str, request_id: str) -> AsyncIterator[None]:
        """The block answers ``tenant``'s request ``request_id`` (empty: nothing to name it by)
        and ends with RequestAborted if Abort names it meanwhile."""
        task = asyncio.current_task()
        if not request_id or task is None:
            yield
            return
        key = (tenant, request_id)
        self._calls.setdefault(key, set()).add(task)
        try:
            yield
        except asyncio.CancelledError:
            if task not in self._aborted:
                raise  # the caller left, or the server stops
            task.uncancel()
            raise RequestAborted from None
        finally:
            self._aborted.discard(task)
            tasks = self._calls[key]
            tasks.discard(task)
            if not tasks:
                del self._calls[key]

    def abort(self, tenant: str, request_ids: Iterable[str]) -> list[str]:
        """Ends ``tenant``'s calls named by ``request_ids``: the ids that named one.

        Raises:
            RequestNotFound: none did.
        """
        wanted = list(dict.fromkeys(request_ids))
        aborted = []
        for request_id in wanted:
            tasks = self._calls.get((tenant, request_id), set())
            for task in tasks - self._aborted:
                self._aborted.add(task)
                task.cancel()
            if tasks:
                aborted.append(request_id)
        if not aborted:
            raise RequestNotFound(len(wanted))
        return aborted

    def __len__(self) -> int:
        return sum(len(tasks) for tasks in self._calls.values())
