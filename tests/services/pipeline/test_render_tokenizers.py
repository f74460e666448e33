"""The render stage's own tokenizers: one per render running, none of vLLM's pooled copies."""

from __future__ import annotations

import copy
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from services.engine.tokenizers import private_copy, unpooled
from services.models import build_tiny_model
from services.pipeline.prompts import RenderTokenizers


class Copy:
    """A stand-in tokenizer that knows which copy it is."""

    def __init__(self, number: int) -> None:
        self.number = number


def test_a_copy_per_render_running_and_no_more() -> None:
    made: list[Copy] = []

    def make() -> Copy:
        made.append(Copy(len(made)))
        return made[-1]

    tokenizers = RenderTokenizers(make)
    both_in = threading.Barrier(2, timeout=30)
    seen: list[int] = []

    def render() -> None:
        with tokenizers.borrowed() as tokenizer:
            seen.append(tokenizer.number)
            both_in.wait()  # two renders hold a tokenizer at once: each its own

    with ThreadPoolExecutor(2) as pool:
        for future in [pool.submit(render) for _ in range(2)]:
            future.result()
    assert sorted(seen) == [0, 1]
    # later renders, one at a time, reuse the copies: none is made again
    for _ in range(5):
        with tokenizers.borrowed() as tokenizer:
            assert tokenizer.number in (0, 1)
    assert len(made) == 2
    assert tokenizers.copies == 2


def test_a_tokenizer_is_given_back_when_a_render_fails() -> None:
    tokenizers = RenderTokenizers(lambda: Copy(0))
    with pytest.raises(ValueError, match="template"), tokenizers.borrowed():
        raise ValueError("a broken template")
    assert tokenizers.copies == 1


@pytest.fixture(scope="module")
def hf_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from transformers import AutoTokenizer

    model = build_tiny_model(Path(tmp_path_factory.mktemp("models")) / "tiny")
    return AutoTokenizer.from_pretrained(model)


def test_the_copy_is_outside_vllms_pool(hf_tokenizer: Any) -> None:
    """vLLM's pool wrapper (what AsyncLLM.get_tokenizer() returns) unwrapped, then copied."""
    from vllm.tokenizers.hf import ThreadSafeHFTokenizerMixin, maybe_make_thread_pool

    # it wraps in place (the tokenizer's class changes): a copy of the fixture's
    pooled = maybe_make_thread_pool(copy.copy(hf_tokenizer))
    assert isinstance(pooled, ThreadSafeHFTokenizerMixin)
    own = private_copy(pooled)
    assert not isinstance(own, ThreadSafeHFTokenizerMixin)
    assert own is not unpooled(pooled)
    text = "Question 7: tell me about topic 7."
    assert own(text)["input_ids"] == pooled(text)["input_ids"]
    # an unpooled tokenizer is copied as it is
    assert unpooled(hf_tokenizer) is hf_tokenizer
