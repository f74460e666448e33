"""A tokenizer for one thread's use alone, outside vLLM's shared pool.

vLLM (``vllm/tokenizers/hf.py``) makes its fast tokenizer thread-safe by routing every call through
a queue of deep copies, and deep-copies one more (100-200 ms, holding the interpreter lock) when a
call finds the queue empty: with mmgate's render threads and vLLM's own tokenization on the loop
contending, those copies landed in the prompt stage's tail. mmgate's render stage keeps copies of
its own instead, one per render thread (services/pipeline/prompts.py), made from the tokenizer
vLLM wrapped.
"""

from __future__ import annotations

import copy
from typing import Any


def unpooled(tokenizer: Any) -> Any:
    """The tokenizer vLLM's pool wraps, or ``tokenizer`` itself where it is not pooled."""
    from vllm.tokenizers.hf import ThreadSafeHFTokenizerMixin

    if isinstance(tokenizer, ThreadSafeHFTokenizerMixin):
        # the pool's own way back to what it wraps (it pickles through it): (factory, (tok, n))
        _, (wrapped, _copies) = tokenizer.__reduce__()
        return wrapped
    return tokenizer


def private_copy(tokenizer: Any) -> Any:
    """A deep copy of ``tokenizer`` that shares no state with vLLM's pool."""
    return copy.deepcopy(unpooled(tokenizer))


__all__ = ["private_copy", "unpooled"]
