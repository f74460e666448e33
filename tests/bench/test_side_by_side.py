"""The benchmarks' fairness: vLLM's own server gets exactly mmgate's engine arguments."""

from __future__ import annotations

import dataclasses

import pytest

from bench.openai_server import server_flags
from services.config import EngineSettings
from services.engine.worker import EngineWorker


@pytest.mark.parametrize("images", [None, 1])
def test_vllms_server_parses_back_mmgates_engine_arguments(images: int | None) -> None:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    settings = EngineSettings(
        dtype="bfloat16", max_model_len=1024, extra={"max_num_batched_tokens": 512}
    )
    worker = EngineWorker(settings, "/models/smol")
    if images is not None:
        worker.accept_images(per_prompt=images, embeddings=False)
    ours = worker.engine_args()
    parser = AsyncEngineArgs.add_cli_args(FlexibleArgumentParser())
    theirs = AsyncEngineArgs.from_cli_args(parser.parse_args(server_flags(ours)))
    # what mmgate sets: every field where its arguments are not vLLM's defaults (where they are,
    # the server's CLI defaults stand, which are vLLM's too)
    defaults = AsyncEngineArgs(model=ours.model)
    chosen = [
        f.name
        for f in dataclasses.fields(ours)
        if getattr(ours, f.name) != getattr(defaults, f.name)
    ]
    differ = {
        name: (getattr(ours, name), getattr(theirs, name))
        for name in chosen
        if not same(getattr(ours, name), getattr(theirs, name))
    }
    assert differ == {}
    assert {"dtype", "max_model_len", "kv_cache_memory_bytes"} <= set(chosen)
    assert (theirs.model, theirs.seed) == (ours.model, ours.seed)
    assert theirs.dtype == "bfloat16"
    assert theirs.kv_cache_memory_bytes == settings.kv_cache_memory_bytes
    assert theirs.max_num_batched_tokens == 512
    assert (theirs.limit_mm_per_prompt or {}).get("image") == images


def same(ours: object, theirs: object) -> bool:
    # the CLI reads one served model name as a list of one
    return ours == theirs or (isinstance(ours, str) and theirs == [ours])
