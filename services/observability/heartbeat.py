"""A blocked event loop, seen from a thread: a heartbeat the loop must answer.

    mmgate-heartbeat thread, every interval: loop.call_soon_threadsafe(beat)
        └─ each beat, on the loop: how long it waited there (the loop's lag, a histogram)
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
import bisect
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
# the upper bounds of mmgate_event_loop_lag_seconds's buckets
LAG_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


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
        # each beat's wait on the loop, by LAG_BUCKETS (the last: beyond them), and their sum:
        # written on the loop, read by the metrics thread
        self.lag_counts = [0] * (len(LAG_BUCKETS) + 1)
        self.lag_sum = 0.0
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

    def _beat(self, sent: float) -> None:
        self._last_beat = now = time.monotonic()
        lag = now - sent
        self.lag_counts[bisect.bisect_left(LAG_BUCKETS, lag)] += 1
        self.lag_sum += lag

    def _watch(self) -> None:
        loop = self.loop
        assert loop is not None
        while not self._stop.wait(self.interval):
            try:
                loop.call_soon_threadsafe(self._beat, time.monotonic())
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
