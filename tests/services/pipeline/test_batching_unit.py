"""The encode batcher on a stand-in encoder: who runs together, who gets which row, and what a
failure or a caller who left does to the others (the real tower: tests/services/engine/
test_encoder.py; end to end: test_images.py)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import Any

import pytest

from services.config import ThreadSettings
from services.pipeline.media.batching import EncodeBatcher
from services.pipeline.threads import ThreadPools

WAIT = 10.0  # seconds a stand-in waits for the test to let it go


class Encoder:
    """Rows are the images doubled; "bad" fails any batch it is in. The first run can be held
    until the test lets it go, so that others queue behind it."""

    def __init__(self, hold_first: bool = False) -> None:
        self.batches: list[list[object]] = []
        self.started = threading.Event()
        self.go = threading.Event()
        if not hold_first:
            self.go.set()

    def __call__(self, images: Sequence[object]) -> list[object]:
        self.batches.append(list(images))
        self.started.set()
        assert self.go.wait(WAIT)
        if "bad" in images:
            raise ValueError("cannot encode this one")
        return [f"{image}{image}" for image in images]


def batcher(encoder: Encoder, max_batch: int = 8, window: float = 0.0) -> EncodeBatcher:
    threads = ThreadPools(ThreadSettings(encode=1))
    return EncodeBatcher(encoder, threads, max_batch=max_batch, window_seconds=window)


async def queued(
    batching: EncodeBatcher, images: Sequence[str]
) -> list[asyncio.Task[tuple[Any, int]]]:
    """``images`` sent while the first run is held: they wait together."""
    tasks = [asyncio.ensure_future(batching.encode(image)) for image in images]
    while len(batching._waiting) < len(images):  # noqa: ASYNC110 - each pass yields to the tasks
        await asyncio.sleep(0)
    return tasks


async def test_a_lone_image_runs_at_once_and_gets_its_row() -> None:
    encoder = Encoder()
    assert await batcher(encoder).encode("a") == ("aa", 1)
    assert encoder.batches == [["a"]]


async def test_images_waiting_while_the_encoder_is_busy_run_together_up_to_the_batch_size() -> None:
    encoder = Encoder(hold_first=True)
    batching = batcher(encoder, max_batch=3)
    first = asyncio.ensure_future(batching.encode("a"))
    assert await asyncio.to_thread(encoder.started.wait, WAIT)
    rest = await queued(batching, ["b", "c", "d", "e"])
    encoder.go.set()
    assert await first == ("aa", 1)
    assert [await task for task in rest] == [("bb", 3), ("cc", 3), ("dd", 3), ("ee", 1)]
    assert encoder.batches == [["a"], ["b", "c", "d"], ["e"]]
    assert batching.batches == 3


async def test_a_window_gathers_images_that_come_close_together() -> None:
    encoder = Encoder()
    batching = batcher(encoder, window=0.05)
    answers = await asyncio.gather(*(batching.encode(image) for image in "abc"))
    assert answers == [("aa", 3), ("bb", 3), ("cc", 3)]


async def test_a_failing_batch_runs_again_one_image_at_a_time() -> None:
    encoder = Encoder(hold_first=True)
    batching = batcher(encoder)
    first = asyncio.ensure_future(batching.encode("a"))
    assert await asyncio.to_thread(encoder.started.wait, WAIT)
    rest = await queued(batching, ["b", "bad", "c"])
    encoder.go.set()
    await first
    results = await asyncio.gather(*rest, return_exceptions=True)
    assert results[0] == ("bb", 1)
    assert results[2] == ("cc", 1)
    assert isinstance(results[1], ValueError)
    assert encoder.batches[1:] == [["b", "bad", "c"], ["b"], ["bad"], ["c"]]


async def test_an_image_whose_callers_left_before_its_batch_is_not_encoded() -> None:
    encoder = Encoder(hold_first=True)
    batching = batcher(encoder)
    first = asyncio.ensure_future(batching.encode("a"))
    assert await asyncio.to_thread(encoder.started.wait, WAIT)
    gone, kept = await queued(batching, ["gone", "kept"])
    gone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gone
    encoder.go.set()
    await first
    assert await kept == ("keptkept", 1)
    assert encoder.batches == [["a"], ["kept"]]
    assert not batching._waiting
