"""The known-answer check of a dtype, in a fresh interpreter.

    python -m services.engine.dtype_check MODEL DTYPE    prints RESULT_PREFIX {"answer": ...}

The answer is the model's greedy reply to dtypes.QUESTION.

A process of its own so that its engine (and the engine core it spawns) is gone when it exits.
"""

from __future__ import annotations

import json
import sys

from .dtypes import QUESTION, RESULT_PREFIX


def main(argv: list[str]) -> int:
    model, dtype = argv
    from vllm import LLM, SamplingParams

    llm = LLM(
        model=model,
        dtype=dtype,
        enforce_eager=True,
        max_model_len=512,
        kv_cache_memory_bytes=64 * 1024 * 1024,
        seed=0,
    )
    outputs = llm.chat(
        [{"role": "user", "content": QUESTION}],
        SamplingParams(temperature=0.0, max_tokens=16),
        use_tqdm=False,
    )
    # vLLM writes to stdout too: the result is the line with the prefix
    sys.stdout.write(RESULT_PREFIX + json.dumps({"answer": outputs[0].outputs[0].text}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
