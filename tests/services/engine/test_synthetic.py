"""The synthetic engine's batching, driven step by step: its clock is an hour a step here, so
nothing moves but the steps a test makes (``SyntheticLLM._step``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any

import pytest
from transformers import AutoTokenizer
from vllm import SamplingParams
from vllm.sampling_params import RequestOutputKind

from services.config import SyntheticSettings
from services.engine.synthetic import SyntheticLLM

pytestmark = pytest.mark.asyncio

HOUR = 3600.0


@pytest.fixture(scope="module")
def tokenizer(tiny_model: str) -> Any:
    return AutoTokenizer.from_pretrained(tiny_model)


def engine(tokenizer: Any, **spec: Any) -> SyntheticLLM:
    seqs = spec.pop("max_num_seqs", 4)
    interval = spec.pop("stream_interval", 1)
    timing = SyntheticSettings(**{"step_seconds": HOUR, "prefill_seconds_per_token": 0.0, **spec})
    return SyntheticLLM(timing, tokenizer, max_num_seqs=seqs, stream_interval=interval)


def params(**kwargs: Any) -> SamplingParams:
    return SamplingParams(**{"max_tokens": 16, "output_kind": RequestOutputKind.DELTA, **kwargs})


async def first(llm: SyntheticLLM, gen: AsyncGenerator[Any, None]) -> asyncio.Task[Any]:
    """The generator's next output awaited in a task, once its request has joined the engine
    (when the generator first runs: a turn or two of the loop)."""
    known = set(llm._runs)
    task = asyncio.ensure_future(anext(gen))
    for _ in range(10):
        if set(llm._runs) - known:
            return task
        await asyncio.sleep(0)
    raise AssertionError("the request never joined")


async def test_each_step_gives_each_running_request_one_token_of_real_text(tokenizer: Any) -> None:
    llm = engine(tokenizer)
    gen = llm.generate({"prompt_token_ids": [1, 2, 3]}, params(ignore_eos=True), "a")
    pending = await first(llm, gen)
    ids: list[int] = []
    text = ""
    for _ in range(16):
        llm._step(1, 0.0)
        output = await pending
        assert len(output.outputs[0].token_ids) == 1  # a consumer that keeps up: one a step
        ids += output.outputs[0].token_ids
        text += output.outputs[0].text
        if output.finished:
            break
        pending = asyncio.ensure_future(anext(gen))
    assert output.finished
    assert output.outputs[0].finish_reason == "length"
    assert len(ids) == 16
    assert text == tokenizer.decode(ids)
    assert text.strip()
    await gen.aclose()
    await llm.close()


async def test_a_consumer_that_falls_behind_gets_the_steps_merged(tokenizer: Any) -> None:
    llm = engine(tokenizer)
    gen = llm.generate({"prompt_token_ids": [5, 6]}, params(ignore_eos=True), "a")
    pending = await first(llm, gen)
    llm._step(1, 0.0)
    llm._step(1, 0.0)
    llm._step(3, 0.0)  # a late clock: three steps at once
    output = await pending
    assert len(output.outputs[0].token_ids) == 5
    assert llm.made == 5
    await gen.aclose()
    await llm.close()


async def test_end_of_sequence_after_the_answer_and_max_tokens_as_vllm(tokenizer: Any) -> None:
    llm = engine(tokenizer, answer_tokens=4)
    gen = llm.generate({"prompt_token_ids": [7]}, params(max_tokens=50), "eos")
    pending = await first(llm, gen)
    llm._step(10, 0.0)
    output = await pending
    ids = list(output.outputs[0].token_ids)
    assert output.finished
    assert output.outputs[0].finish_reason == "stop"
    assert len(ids) == 5
    assert ids[-1] == tokenizer.eos_token_id
    assert tokenizer.decode(ids[:-1]) == output.outputs[0].text
    cut = llm.generate({"prompt_token_ids": [7]}, params(max_tokens=3), "cut")
    pending = await first(llm, cut)
    llm._step(10, 0.0)
    output = await pending
    assert output.outputs[0].finish_reason == "length"
    assert len(output.outputs[0].token_ids) == 3
    # min_tokens pushes the end past the answer
    late = llm.generate({"prompt_token_ids": [7]}, params(max_tokens=50, min_tokens=9), "late")
    pending = await first(llm, late)
    llm._step(20, 0.0)
    output = await pending
    assert len(output.outputs[0].token_ids) == 10
    await llm.close()


async def test_max_num_seqs_run_at_once_and_the_rest_wait_in_order(tokenizer: Any) -> None:
    llm = engine(tokenizer, max_num_seqs=2)
    gens = [
        llm.generate({"prompt_token_ids": [i]}, params(max_tokens=2), f"r{i}") for i in range(3)
    ]
    tasks = [await first(llm, gen) for gen in gens]
    llm._step(1, 0.0)
    assert (llm.running, llm.waiting) == (2, 1)
    assert [t.done() for t in tasks] == [False, False, False]
    await asyncio.gather(tasks[0], tasks[1])
    llm._step(1, 0.0)  # the first two end, their places free from the next step on
    assert (llm.running, llm.waiting) == (0, 1)
    llm._step(1, 0.0)  # the third joins and makes its first token
    assert (llm.running, llm.waiting) == (1, 0)
    third = await tasks[2]
    assert len(third.outputs[0].token_ids) == 1
    for gen in gens:
        await gen.aclose()
    await llm.close()


async def test_a_prompt_waits_its_prefill_before_its_first_token(tokenizer: Any) -> None:
    llm = engine(tokenizer, prefill_seconds_per_token=1.0)
    gen = llm.generate({"prompt_token_ids": list(range(100))}, params(), "long")
    pending = await first(llm, gen)
    llm._step(1, 0.0)  # admitted at t=0: ready at t=100
    llm._step(1, 99.0)
    assert not pending.done()
    assert llm.made == 0
    llm._step(1, 100.0)
    assert len((await pending).outputs[0].token_ids) == 1
    await gen.aclose()
    await llm.close()


async def test_a_consumer_that_leaves_frees_its_place_and_abort_ends_a_stream(
    tokenizer: Any,
) -> None:
    llm = engine(tokenizer, max_num_seqs=1)
    gone = llm.generate({"prompt_token_ids": [1]}, params(), "gone")
    pending = await first(llm, gone)
    llm._step(1, 0.0)
    await pending
    await gone.aclose()
    assert (llm.running, llm.waiting, len(llm._runs)) == (0, 0, 0)
    # a caller cancelled while it waits for its next token: the same
    waiting = await first(llm, llm.generate({"prompt_token_ids": [1]}, params(), "cancelled"))
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)
    assert (llm.running, llm.waiting, len(llm._runs)) == (0, 0, 0)
    kept = llm.generate({"prompt_token_ids": [1]}, params(), "kept")
    pending = await first(llm, kept)
    await llm.abort("kept")
    output = await pending
    assert output.finished
    assert output.outputs[0].finish_reason == "abort"
    assert (llm.running, llm.waiting) == (0, 0)
    await llm.close()


async def test_final_only_and_stream_interval(tokenizer: Any) -> None:
    llm = engine(tokenizer, stream_interval=4)
    whole = llm.generate(
        {"prompt_token_ids": [2]}, params(output_kind=RequestOutputKind.FINAL_ONLY), "whole"
    )
    spaced = llm.generate({"prompt_token_ids": [2]}, params(max_tokens=9), "spaced")
    whole_first = await first(llm, whole)
    sizes: list[int] = []
    pending = await first(llm, spaced)
    run = llm._runs["spaced"]
    for _ in range(16):
        llm._step(1, 0.0)
        if not run.event.is_set():
            continue  # the engine held this step's token back
        output = await pending
        sizes.append(len(output.outputs[0].token_ids))
        if output.finished:
            break
        pending = asyncio.ensure_future(anext(spaced))
    assert sizes == [1, 4, 4]  # the first at once, then every four, the last when it ends
    assert not whole_first.done()
    llm._step(7, 0.0)  # 16 tokens: the whole answer in one output
    output = await whole_first
    assert output.finished
    assert len(output.outputs[0].token_ids) == 16
    await llm.close()


async def test_the_real_clock_makes_a_step_every_step_seconds(tokenizer: Any) -> None:
    llm = SyntheticLLM(SyntheticSettings(step_seconds=0.001), tokenizer, max_num_seqs=4)
    outputs = [
        o async for o in llm.generate({"prompt_token_ids": [3]}, params(ignore_eos=True), "c")
    ]
    assert sum(len(o.outputs[0].token_ids) for o in outputs) == 16
    assert llm.steps >= 16
    await llm.close()
