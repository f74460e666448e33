"""A blocked event loop, seen from a thread: a heartbeat the loop must answer.

    mmgate-heartbeat thread, every interval: loop.call_soon_threadsafe(beat)
        └─ no beat for block_seconds ─▶ blocked: a warning with the stack the loop's thread is
           in (what it is stuck on), blocks += 1, on_block() queued for the loop
        └─ beats again ─▶ "moved again after N s"; recent(within) stays true a while

Nothing on the loop can report that the loop has stopped (the cache actor's own watchdog is a
timer on it, and so is the health monitor), and the gRPC health service answers from the loop
too: a probe of a blocked loop times out. The thread sees it, logs it, and counts it; ``blocked``
and ``blocks`` are plain values the metrics thread reads while the loop is still stuck; and the
health monitor keeps readiness NOT_SERVING for a while once the loop moves again.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import final

log = logging.getLogger("mmgate.heartbeat")

# frames of the loop thread's stack in the warning (the innermost ones)
STACK_FRAMES = 30


@final
class LoopHeartbeat:
    def __init__(self, *, block_seconds: float, on_block: Callable[[], None] | None = None) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self.block_seconds = block_seconds
        # a few beats within the threshold, so a block is seen soon after it passes it
        self.interval = block_seconds / 4
        self.on_block = on_block
        self.blocks = 0
        self.blocked_since: float | None = None  # set by the thread while the loop is stuck
        self.last_block_end = float("-inf")
        self._last_beat = time.monotonic()
        self._loop_thread = threading.get_ident()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="mmgate-heartbeat", daemon=True)

    def start(self) -> None:
        """On the loop: the loop to watch, and the thread whose stack a block shows."""
        self.loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._last_beat = time.monotonic()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join(timeout=5)

    @property
    def blocked(self) -> bool:
        return self.blocked_since is not None

    def recent(self, within: float) -> bool:
        """Blocked now, or a block ended less than ``within`` seconds ago."""
        return self.blocked or time.monotonic() - self.last_block_end < within

    def _beat(self) -> None:
        self._last_beat = time.monotonic()

    def _watch(self) -> None:
        loop = self.loop
        assert loop is not None
        while not self._stop.wait(self.interval):
            try:
                loop.call_soon_threadsafe(self._beat)
            except RuntimeError:  # the loop has closed
                return
            now = time.monotonic()
            silent = now - self._last_beat
            if silent >= self.block_seconds and self.blocked_since is None:
                self.blocked_since = self._last_beat
                self.blocks += 1
                log.warning(
                    "event loop blocked: no heartbeat for %.1f s; health turns NOT_SERVING. "
                    "The loop's thread is in:\n%s",
                    silent,
                    self._loop_stack(),
                )
                if self.on_block is not None:
                    try:  # runs first thing when the loop moves again
                        loop.call_soon_threadsafe(self.on_block)
                    except RuntimeError:  # the loop has closed meanwhile
                        return
            elif silent < self.block_seconds and self.blocked_since is not None:
                log.warning(
                    "event loop moved again after %.1f s", self._last_beat - self.blocked_since
                )
                self.last_block_end = self._last_beat
                self.blocked_since = None

    def _loop_stack(self) -> str:
        frame = sys._current_frames().get(self._loop_thread)
        if frame is None:
            return "  (the loop's thread is gone)"
        return "".join(traceback.format_stack(frame)[-STACK_FRAMES:]).rstrip()


__all__ = ["LoopHeartbeat"]
