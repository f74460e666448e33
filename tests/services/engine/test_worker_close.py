"""Closing the engine worker (the real engine on the tiny model, in process): mmgate stops using
the engine before the engine stops. vLLM's shutdown stops its core first and its output handler
after, so a handler still waiting for output met a dead core and logged EngineDeadError's
traceback (one shutdown in two, in a benchmark)."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from services.config import EngineSettings
from services.engine.worker import EngineWorker
from services.types import EngineRequest, Sampling


async def test_the_output_handler_stops_before_the_engine_core(
    tiny_model: str, caplog: pytest.LogCaptureFixture
) -> None:
    settings = EngineSettings(model=tiny_model, max_model_len=256, kv_cache_memory_bytes=64 << 20)
    worker = EngineWorker(settings, tiny_model)
    await worker.start()
    request = EngineRequest(
        request_id="mmgate-close-test",
        prompt_token_ids=(1, 2, 3),
        sampling=Sampling(max_tokens=2, temperature=0.0),
    )
    deltas = [delta async for delta in worker.generate(request)]
    assert deltas[-1].finish_reason == "length"

    engine: Any = worker._engine
    handler = engine.output_handler
    assert handler is not None
    assert not handler.done()  # waiting for the engine's next output
    core = engine.engine_core
    handler_done_at_core_shutdown: list[bool] = []
    shut_down = core.shutdown

    def shutdown(*args: Any, **kwargs: Any) -> None:
        handler_done_at_core_shutdown.append(handler.done())
        shut_down(*args, **kwargs)

    core.shutdown = shutdown
    caplog.set_level(logging.ERROR, logger="vllm")
    await worker.close()
    assert handler_done_at_core_shutdown == [True]
    assert not [r for r in caplog.records if "output_handler failed" in r.getMessage()]
