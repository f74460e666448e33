"""Where a stalled computation is waiting, for the watchdog's report.

``Task.get_stack()`` returns only the task's outermost coroutine frame (a suspended coroutine's
frame has no ``f_back``), which for a flight is always the actor's compute wrapper. The frames
that matter, the computation's own, hang off the ``cr_await`` chain, so walk that instead.
"""

from __future__ import annotations

import asyncio
import traceback
from types import FrameType
from typing import Any


def await_stack(task: asyncio.Task[Any], limit: int = 50) -> str:
    """The frames a suspended task is awaiting through, outermost first, formatted."""
    frames: list[tuple[FrameType, int]] = []
    awaitable: Any = task.get_coro()
    while awaitable is not None and len(frames) < limit:
        frame = getattr(awaitable, "cr_frame", None) or getattr(awaitable, "gi_frame", None)
        if frame is not None:
            frames.append((frame, frame.f_lineno))
        awaitable = getattr(awaitable, "cr_await", None) or getattr(awaitable, "gi_yieldfrom", None)
    if not frames:  # not a coroutine we can walk: fall back to what asyncio knows
        frames = [(frame, frame.f_lineno) for frame in task.get_stack(limit=limit)]
    return "".join(traceback.StackSummary.extract(frames).format())
