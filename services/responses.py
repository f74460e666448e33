"""Shared responses: one engine run streamed to every identical deterministic request.

    first request ──▶ cache flight ──▶ ResponseRecording + producer task ◀── engine deltas
    joiners, later hits ──────────────▶ recording.replay(): what is there, then what arrives

The recording is what the cache stores: a request that joins while the answer is being generated
streams it live, and one that comes later replays it whole. A failed run is dropped from the cache
so the next request generates afresh.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import final

from .engine import EngineDelta

# Bytes a streamed token costs in a recording (id, text, bookkeeping): the weight admitted up front.
BYTES_PER_TOKEN = 64


@final
class ResponseRecording:
    def __init__(self, max_tokens: int) -> None:
        self.deltas: list[EngineDelta] = []
        self.error: BaseException | None = None
        self.done = False
        # admitted to the cache before it is complete: weigh what it may grow to
        self.nbytes = BYTES_PER_TOKEN * max_tokens
        self._changed = asyncio.Event()

    def append(self, delta: EngineDelta) -> None:
        self.deltas.append(delta)
        self._notify()

    def finish(self, error: BaseException | None = None) -> None:
        self.error = error
        self.done = True
        self._notify()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def replay(self) -> AsyncGenerator[EngineDelta, None]:
        """Every delta from the first; waits for new ones until the run ends."""
        index = 0
        while True:
            while index < len(self.deltas):
                yield self.deltas[index]
                index += 1
            if self.done:
                if self.error is not None:
                    raise self.error
                return
            # bounded by the caller's deadline and by the producer's own (it always finishes)
            await self._changed.wait()
