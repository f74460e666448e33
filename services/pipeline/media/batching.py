"""Encodes of different images that wait at the same time run as one batch of the vision encoder.

    flight A ─ encode(a) ─┐
    flight B ─ encode(b) ─┼─▶ waiting ─▶ a collector, once the "encode" pool has a thread
    flight C ─ encode(c) ─┘              (and after the window, if one is set), takes up to
                                         encode_batch of them ─▶ encoder.encode([a, b, c])
                                         ─▶ each flight gets its own row

A GPU encodes 8 images in about the time of one, and two CPU cores 2-3 times as many images a
second at batch 8 as at batch 1 (docs/benchmarks.md). With no window a lone image runs at once;
images batch while the encoder is busy with earlier ones. Each image keeps its own cache flight,
span and outcome: a batch that fails is run again one image at a time, so one bad image fails
only its own requests. A flight whose waiters all leave before its image is taken is dropped
from the batch (the wait is ``waiting_to_start``); once taken, the run goes to its end.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, final

from cache_actor import waiting_to_start

from ...types import MediaStats
from ..threads import ThreadPools

__all__ = ["EncodeBatcher"]

log = logging.getLogger("mmgate.media")

Encode = Callable[[Sequence[Any]], Any]  # images -> a tensor of one row per image


def _future() -> asyncio.Future[Any]:
    return asyncio.get_running_loop().create_future()


@dataclass(eq=False, slots=True)
class _Entry:
    image: Any
    taken: asyncio.Future[None] = field(default_factory=_future)
    done: asyncio.Future[tuple[Any, int]] = field(default_factory=_future)


@final
class EncodeBatcher:
    """Batches of up to ``max_batch`` images through ``encode`` on the "encode" thread pool."""

    def __init__(
        self,
        encode: Encode,
        threads: ThreadPools,
        *,
        max_batch: int,
        window_seconds: float = 0.0,
        stats: MediaStats | None = None,
    ) -> None:
        self._encode = encode
        self._threads = threads
        self.max_batch = max_batch
        self.window_seconds = window_seconds
        self._waiting: list[_Entry] = []
        self._collecting = False  # a collector waits for a thread and will take what waits
        self._tasks: set[asyncio.Task[None]] = set()
        # its runs are counted where the media stage counts its work
        self.stats = stats if stats is not None else MediaStats()

    @property
    def batches(self) -> int:
        """Runs of the encoder so far."""
        return self.stats.encode_batches

    async def encode(self, image: Any) -> tuple[Any, int]:
        """``image``'s row of the encoder's output, and how many images its batch held."""
        entry = _Entry(image)
        self._waiting.append(entry)
        self._collect_soon()
        try:
            with waiting_to_start():
                await entry.taken
            return await entry.done
        finally:
            # gone before its batch ran: not taken, or its row not wanted
            entry.done.cancel()
            if entry in self._waiting:
                self._waiting.remove(entry)

    def _collect_soon(self) -> None:
        if self._collecting or not self._waiting:
            return
        self._collecting = True
        task = asyncio.get_running_loop().create_task(self._collect(), name="mmgate-encode-batch")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _collect(self) -> None:
        batch: list[_Entry] = []
        try:
            async with self._threads.capacity("encode"):
                if self.window_seconds > 0:
                    await asyncio.sleep(self.window_seconds)  # the batching window, bounded
                batch, self._waiting = (
                    self._waiting[: self.max_batch],
                    self._waiting[self.max_batch :],
                )
                self._collecting = False
                self._collect_soon()  # the rest wait for the next thread
                for entry in batch:
                    entry.taken.set_result(None)
                if batch:
                    await self._run(batch)
        finally:
            if not batch:
                self._collecting = False
            for entry in batch:
                entry.done.cancel()  # a row not set (a cancelled run): its flight fails

    async def _run(self, batch: list[_Entry]) -> None:
        self.stats.encode_batches += 1
        try:
            rows = await self._threads.in_thread("encode", self._encode, [e.image for e in batch])
        except Exception as exc:  # noqa: BLE001 - handed to each image's flight
            if len(batch) == 1:
                _settle(batch[0], error=exc)
                return
            log.warning("a batch of %d encodes failed (%s): one image at a time", len(batch), exc)
            for entry in batch:
                self.stats.encode_batches += 1
                try:
                    (row,) = await self._threads.in_thread("encode", self._encode, [entry.image])
                except Exception as single:  # noqa: BLE001 - handed to its flight
                    _settle(entry, error=single)
                else:
                    _settle(entry, (row, 1))
            return
        for index, entry in enumerate(batch):
            _settle(entry, (rows[index], len(batch)))


def _settle(
    entry: _Entry, result: tuple[Any, int] | None = None, error: Exception | None = None
) -> None:
    if entry.done.done():  # its flight has gone
        return
    if result is not None:
        entry.done.set_result(result)
    else:
        entry.done.set_exception(error or RuntimeError("no encoder output"))
