"""What the engine watchdog reads: the engine requests mmgate has open, and the engine's last step.

    worker.generate ── opened(id, label) ... closed(id) ──▶ open requests
    vLLM's stat logger, once per engine step ── stepped() ──▶ last step
    the health monitor (api/health.py) ── silence(now), oldest() ──▶ stalled? hung?

Progress is an engine step, not a token to a caller: vLLM reports scheduler stats every step, a
long prefill's chunks included, and none while its engine core is stopped (SIGSTOP, a hung
kernel, a deadlock). Silence counts only while a request is open, since an idle engine does not
step either, and from the moment the first one opened.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import final


@final
@dataclass(frozen=True, slots=True)
class OpenRequest:
    request_id: str  # the engine's (mmgate's own)
    label: str  # the caller's request_id, if any
    opened: float  # time.monotonic()


@final
class Progress:
    """Plain fields, touched on the event loop only (generate and vLLM's output handler)."""

    __slots__ = ("_busy_since", "last_step", "open")

    def __init__(self) -> None:
        self.open: dict[str, OpenRequest] = {}
        self.last_step = time.monotonic()
        self._busy_since = self.last_step

    def opened(self, request_id: str, label: str) -> None:
        now = time.monotonic()
        if not self.open:
            self._busy_since = now
        self.open[request_id] = OpenRequest(request_id, label, now)

    def closed(self, request_id: str) -> None:
        self.open.pop(request_id, None)

    def stepped(self) -> None:
        self.last_step = time.monotonic()

    @property
    def in_flight(self) -> int:
        return len(self.open)

    def silence(self, now: float) -> float:
        """Seconds without an engine step while requests were open (0 when none is)."""
        if not self.open:
            return 0.0
        return max(0.0, now - max(self.last_step, self._busy_since))

    def oldest(self, count: int = 3) -> list[OpenRequest]:
        return sorted(self.open.values(), key=lambda r: r.opened)[:count]


__all__ = ["OpenRequest", "Progress"]
