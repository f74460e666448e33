"""Two of bench/frontend.py's servers over the synthetic engine, each run as a process of its own.

    python -m bench.frontend_servers mmgate --port P --model DIR [--step-ms 15] [--otlp H:P]
        mmgate serve, its settings from the environment (MMGATE_*), the engine handed in:
        synthetic_engine(spec): every part of mmgate's front end is the real one
    python -m bench.frontend_servers bare --port P --model DIR [--step-ms 15] [--stream-interval K]
        the limit: a grpc.aio servicer of mmgate's Inference.Generate that tokenizes the prompt,
        runs the synthetic engine and writes each of its outputs as a TokenDelta, then the final
        message; no auth, cache, queue, admission, tracing or metrics: what a Python gRPC
        stream of the same messages costs on asyncio's loop, which mmgate runs on too

The synthetic engine's timing comes from the same flags in both (and in bench/synthetic_vllm.py,
which runs vLLM's servers over it).
"""

from __future__ import annotations

import argparse
import asyncio
import uuid
from typing import Any

import grpc
from grpc_health.v1 import health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from services.api.server import serve
from services.config import Settings
from services.engine.synthetic import SyntheticLLM, SyntheticSpec, synthetic_engine
from services.proto.mmgate.v1 import inference_pb2 as pb


def spec_of(args: argparse.Namespace) -> SyntheticSpec:
    return SyntheticSpec(
        step_s=args.step_ms / 1000,
        prefill_s_per_token=args.prefill_us_per_token / 1e6,
        answer_tokens=args.answer_tokens,
    )


async def serve_mmgate(args: argparse.Namespace) -> None:
    tracing = {"endpoint": args.otlp, "protocol": "grpc", "sample_ratio": 1.0} if args.otlp else {}
    settings = Settings(
        host="127.0.0.1",
        port=args.port,
        engine={
            "model": args.model,
            "max_num_seqs": args.max_num_seqs,
            "stream_interval": args.stream_interval,
        },
        max_concurrent_requests=4 * args.max_num_seqs,
        metrics={"port": 0},
        tracing=tracing,
    )
    await serve(settings, engine=synthetic_engine(spec_of(args)))


async def serve_bare(args: argparse.Namespace) -> None:
    from transformers import AutoTokenizer
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    llm = SyntheticLLM(
        spec_of(args),
        tokenizer,
        max_num_seqs=args.max_num_seqs,
        stream_interval=args.stream_interval,
    )
    ends = {"stop": pb.FINISH_REASON_STOP, "length": pb.FINISH_REASON_LENGTH}

    async def generate(request: pb.GenerateRequest, context: Any) -> Any:
        text = request.chat.messages[-1].content if request.HasField("chat") else request.prompt
        params = SamplingParams(
            max_tokens=request.sampling.max_tokens,
            ignore_eos=request.sampling.ignore_eos,
            output_kind=RequestOutputKind.DELTA,
        )
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        finish = None
        count = 0
        outputs = llm.generate({"prompt_token_ids": ids}, params, uuid.uuid4().hex)
        async for output in outputs:
            sample = output.outputs[0]
            finish = sample.finish_reason
            count += len(sample.token_ids)
            yield pb.GenerateResponse(
                delta=pb.TokenDelta(text=sample.text, token_ids=sample.token_ids)
            )
        yield pb.GenerateResponse(
            final=pb.GenerateFinal(
                finish_reason=ends.get(finish or "", pb.FINISH_REASON_ABORT),
                usage=pb.Usage(prompt_tokens=len(ids), completion_tokens=count),
            )
        )

    server = grpc.aio.server()
    handler = grpc.unary_stream_rpc_method_handler(
        generate,
        request_deserializer=pb.GenerateRequest.FromString,
        response_serializer=pb.GenerateResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("mmgate.v1.Inference", {"Generate": handler}),)
    )
    health_pb2_grpc.add_HealthServicer_to_server(HealthServicer(), server)  # SERVING
    server.add_insecure_port(f"127.0.0.1:{args.port}")
    await server.start()
    await server.wait_for_termination()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("kind", choices=("mmgate", "bare"))
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--step-ms", type=float, default=15.0)
    parser.add_argument("--prefill-us-per-token", type=float, default=20.0)
    parser.add_argument("--answer-tokens", type=int, default=128)
    parser.add_argument("--max-num-seqs", type=int, default=1024)
    parser.add_argument("--stream-interval", type=int, default=1, help="tokens a message")
    parser.add_argument("--otlp", default="", help="mmgate: export every trace to this receiver")
    args = parser.parse_args()
    asyncio.run(serve_mmgate(args) if args.kind == "mmgate" else serve_bare(args))


if __name__ == "__main__":
    main()
