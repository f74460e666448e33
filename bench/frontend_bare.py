"""The limit of bench/frontend.py: a bare grpc.aio servicer over the synthetic engine, in a
process of its own.

    python -m bench.frontend_bare --port P --model DIR [--step-ms 15] [--stream-interval K]

mmgate's Inference.Generate with nothing else: it tokenizes the prompt, runs the synthetic engine
(services/engine/synthetic.py) and writes each of its outputs as a TokenDelta, then the final
message; no auth, cache, queue, admission, tracing or metrics. What a Python gRPC stream of the
same messages costs on asyncio's loop, which mmgate runs on too.
"""

from __future__ import annotations

import argparse
import asyncio
import uuid
from typing import Any

import grpc
from grpc_health.v1 import health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from services.engine.synthetic import SyntheticLLM
from services.proto.mmgate.v1 import inference_pb2 as pb

from .synthetic_vllm import add_timing_options, timing_of


async def serve_bare(args: argparse.Namespace) -> None:
    from transformers import AutoTokenizer
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    llm = SyntheticLLM(
        timing_of(args),
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
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model", required=True)
    add_timing_options(parser)
    parser.add_argument("--max-num-seqs", type=int, default=1024)
    parser.add_argument("--stream-interval", type=int, default=1, help="tokens a message")
    args = parser.parse_args()
    asyncio.run(serve_bare(args))


if __name__ == "__main__":
    main()
