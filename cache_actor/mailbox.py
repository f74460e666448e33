"""The actor's mailbox: requests are bounded, control messages always get in.

    callers ── offer(request) ──▶ [requests]  (at most ``capacity``: else refused at once)
    flights ── post(control) ───▶ [control ]  completions, waiters leaving, timers, close
                                      │
                                      ▼ take(): control first, then requests
                                  the actor's loop

A control message is owed by something the actor already admitted (a flight finishing, a waiter
it holds leaving), so its count is bounded by the flights and waiters and it must never be
refused: refusing a completion would strand every waiter of that flight.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import final


@final
class Mailbox:
    __slots__ = ("_capacity", "_control", "_requests", "_wakeup", "rejected")

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._requests: deque[object] = deque()
        self._control: deque[object] = deque()
        self._wakeup: asyncio.Future[None] | None = None
        self.rejected = 0

    def __len__(self) -> int:
        return len(self._requests) + len(self._control)

    def offer(self, request: object) -> bool:
        """Queue a caller's request; False, queueing nothing, when the mailbox is full."""
        if len(self._requests) >= self._capacity:
            self.rejected += 1
            return False
        self._requests.append(request)
        self._wake()
        return True

    def post(self, message: object) -> None:
        """Queue a control message; never refused."""
        self._control.append(message)
        self._wake()

    def take(self) -> object | None:
        if self._control:
            return self._control.popleft()
        if self._requests:
            return self._requests.popleft()
        return None

    async def wait(self) -> None:
        """Return once a message is queued (at once if one is)."""
        if self._requests or self._control:
            return
        self._wakeup = asyncio.get_running_loop().create_future()
        await self._wakeup

    def _wake(self) -> None:
        wakeup = self._wakeup
        if wakeup is not None:
            self._wakeup = None
            if not wakeup.done():
                wakeup.set_result(None)
