"""One of vLLM's own servers over the synthetic engine: its front end measured at no engine cost.

    python -m bench.synthetic_vllm [--step-ms 15] [--prefill-us-per-token 20] [--answer-tokens 128]
        MODULE [ARGS...]
    MODULE: vllm.entrypoints.launchers.grpc_server (smg-grpc-servicer's VllmEngineServicer)
            or vllm.entrypoints.openai.api_server; ARGS go to it untouched
        AsyncLLM, real: config, renderer and tokenizer, health, the engine core process with
        the model loaded (idle: no request ever reaches it)
        AsyncLLM.generate, AsyncLLM.abort ─▶ SyntheticLLM, one per AsyncLLM
            (services/engine/synthetic.py: one clock, every --step-ms a token for each running
            request, the engine's max_num_seqs and stream_interval)

For benchmarks only. The two methods are replaced on vLLM's class before MODULE runs as
``__main__`` in this process, so whatever the server does around them is vLLM's (or smg's) own
code: parsing the request, rendering the chat template, streaming, detokenized text out. Only
generation is synthetic; its timing is the same as mmgate's synthetic engine's, so the front ends
compare over one engine that costs no CPU. A prompt arrives as token ids (a dict, or what vLLM's
renderer made of one); text is tokenized here with the engine's tokenizer. A request for
cumulative outputs (vLLM's default, which smg's planned warm-up asks for) gets the synthetic
engine's deltas summed up. LoRA, priorities, data-parallel ranks and tracing are taken and
ignored.
"""

from __future__ import annotations

import argparse
import contextlib
import runpy
import sys
import weakref
from collections.abc import AsyncGenerator, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from services.config import SyntheticSettings
from services.engine.synthetic import SyntheticLLM

if TYPE_CHECKING:
    from vllm.outputs import CompletionOutput, RequestOutput
    from vllm.v1.engine.async_llm import AsyncLLM

MODULES = ("vllm.entrypoints.launchers.grpc_server", "vllm.entrypoints.openai.api_server")


def add_timing_options(parser: argparse.ArgumentParser) -> None:
    """The synthetic engine's timing as flags: every server of bench/frontend.py takes these."""
    parser.add_argument("--step-ms", type=float, default=15.0, help="one decode step of the batch")
    parser.add_argument("--prefill-us-per-token", type=float, default=20.0)
    parser.add_argument("--answer-tokens", type=int, default=128, help="then end-of-sequence")


def timing_of(options: argparse.Namespace) -> SyntheticSettings:
    """The flags of ``add_timing_options`` as the engine's settings."""
    return SyntheticSettings(
        step_seconds=options.step_ms / 1000,
        prefill_seconds_per_token=options.prefill_us_per_token / 1e6,
        answer_tokens=options.answer_tokens,
    )


def parse(argv: Sequence[str]) -> tuple[SyntheticSettings, str, list[str]]:
    """The engine's timing, the server's module, and the server's own arguments."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.synthetic_vllm",
        description="Run one of vLLM's servers with a synthetic engine (benchmarks only).",
    )
    add_timing_options(parser)
    parser.add_argument("module", help=" or ".join(MODULES))
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the server's arguments")
    options = parser.parse_args(argv)
    args = list(options.args)
    return timing_of(options), options.module, args[1:] if args[:1] == ["--"] else args


def install(timing: SyntheticSettings) -> None:
    """AsyncLLM's ``generate`` and ``abort`` routed to a SyntheticLLM of the instance's own."""
    from vllm.v1.engine.async_llm import AsyncLLM

    engines: weakref.WeakKeyDictionary[AsyncLLM, SyntheticLLM] = weakref.WeakKeyDictionary()

    def synthetic(llm: AsyncLLM) -> SyntheticLLM:
        engine = engines.get(llm)
        if engine is None:
            scheduler = llm.vllm_config.scheduler_config
            engine = engines[llm] = SyntheticLLM(
                timing,
                llm.get_tokenizer(),
                max_num_seqs=scheduler.max_num_seqs,
                stream_interval=scheduler.stream_interval,
            )
        return engine

    def generate(
        self: AsyncLLM, prompt: Any, sampling_params: Any, request_id: str, **_: Any
    ) -> AsyncGenerator[RequestOutput, None]:
        from vllm.sampling_params import RequestOutputKind

        engine, prompt = synthetic(self), token_prompt(prompt, self)
        if sampling_params.output_kind != RequestOutputKind.CUMULATIVE:
            return engine.generate(prompt, sampling_params, request_id)
        deltas = sampling_params.clone()
        deltas.output_kind = RequestOutputKind.DELTA
        return cumulative(engine.generate(prompt, deltas, request_id))

    async def abort(
        self: AsyncLLM, request_id: str | Iterable[str], internal: bool = False
    ) -> None:
        await synthetic(self).abort(request_id, internal)

    AsyncLLM.generate = generate
    AsyncLLM.abort = abort


def token_prompt(prompt: Any, llm: AsyncLLM) -> Any:
    """The prompt as the synthetic engine takes it: token ids (text tokenized here)."""
    if isinstance(prompt, dict) and "prompt_token_ids" not in prompt:
        prompt = prompt.get("prompt", prompt)
    if isinstance(prompt, str):
        return {"prompt_token_ids": llm.get_tokenizer().encode(prompt)}
    return prompt


async def cumulative(
    deltas: AsyncGenerator[RequestOutput, None],
) -> AsyncGenerator[RequestOutput, None]:
    """Delta outputs summed up: what a CUMULATIVE request gets (vLLM's default output kind)."""
    so_far: dict[int, CompletionOutput] = {}
    async with contextlib.aclosing(deltas):
        async for output in deltas:
            for new in output.outputs:
                if (old := so_far.get(new.index)) is not None:
                    new.text = old.text + new.text
                    new.token_ids = [*old.token_ids, *new.token_ids]
                so_far[new.index] = new
            output.outputs = sorted(so_far.values(), key=lambda completion: completion.index)
            yield output


def main(argv: Sequence[str] | None = None) -> None:
    timing, module, args = parse(sys.argv[1:] if argv is None else argv)
    install(timing)
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
