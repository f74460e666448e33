"""One engine run, down through mmgate's queue and fault injection to the engine, and back up.

    Pipeline.generate (a run of its own) ──┐
    SharedResponses' producer (a run for   ├─▶ runner.run(run, tenant)
      every identical request) ────────────┘      │
        ◀── QueueWait(seconds) ◀── queue.admit(run, tenant): the run's slots   queue.py
        ◀── EngineDelta ...    ◀── chaos.engine(engine.generate(run))           chaos.py
                                   queue.release(slot): the run ended, failed or was left

Each layer calls the one below and yields what it learns to the one above, as httpx's
``send`` reaches its transport: nothing below calls back up. The wait for the engine's slots is
the stream's first event, so the caller reports it (``queue_ms``) without handing anything down.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import final

from ..engine.protocol import Engine
from ..types import EngineDelta, EngineRequest
from .chaos import NoChaos
from .queue import EngineQueue


@final
@dataclass(frozen=True, slots=True)
class QueueWait:
    """How long a run waited in mmgate's queue for its engine slots."""

    seconds: float


@final
class EngineRunner:
    """Runs engine requests: each waits in ``queue`` for its slots, then goes to ``engine``
    through ``chaos`` (fault injection, a no-op unless enabled)."""

    def __init__(self, engine: Engine, queue: EngineQueue, chaos: NoChaos) -> None:
        self.engine = engine
        self.queue = queue
        self.chaos = chaos

    @property
    def model_name(self) -> str:
        """The model every run answers with."""
        return self.engine.model_name

    async def run(
        self, run: EngineRequest, tenant: str
    ) -> AsyncGenerator[QueueWait | EngineDelta, None]:
        """One QueueWait once ``run`` has its slots, then the engine's deltas. Leaving early
        (cancellation, deadline) leaves the queue or aborts the engine request; either way the
        slots go back."""
        slot = await self.queue.admit(run, tenant)
        try:
            yield QueueWait(slot.waited)
            stream = self.chaos.engine(self.engine.generate(run), tenant)
            async with contextlib.aclosing(stream) as deltas:
                async for delta in deltas:
                    yield delta
        finally:
            self.queue.release(slot)


__all__ = ["EngineRunner", "QueueWait"]
