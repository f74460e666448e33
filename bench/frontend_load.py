"""The load generator of bench/frontend.py: S closed-loop streams at one server, in a process of
its own, printing what it received as one JSON line.

    python -m bench.frontend_load --protocol mmgate|mmgate-ids|vllm-grpc|openai --target HOST:PORT
        --streams S --seconds D --warmup W --model DIR --server-pid PID [--server-pid PID ...]

Each stream sends a request (a new prompt each time, greedy, ``--max-tokens`` exactly) as soon as
the last one ended, so the engine's batch stays full. Counted over the window after the warm-up:
tokens and messages received, each message's gap from the one before in its stream (the
inter-token latency: one engine step when nothing falls behind), each request's time to its
first token, this process's CPU seconds and the server's (its main process, all its threads).
The protocols: mmgate's Inference.Generate (mmgate, and the bare servicer, which speaks it),
vLLM's gRPC ``VllmEngine.Generate`` (token ids in, as vLLM's servicer takes them), and vLLM's
OpenAI chat completions streamed as server-sent events (httpx, read line by line).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
import httpx

from services.client import build_request
from services.proto.mmgate.v1 import inference_pb2_grpc

from .service import percentile, process_cpu_seconds
from .vllm_grpc import chat_token_ids

STREAMS_PER_CONNECTION = 64  # callers have connections of their own; so do these streams
Messages = AsyncIterator[int]  # the tokens in each message received


@dataclass(slots=True)
class Window:
    """What arrived between ``start`` and ``end`` (perf_counter seconds)."""

    start: float
    end: float
    tokens: int = 0
    messages: int = 0
    requests: int = 0
    gaps: list[float] = field(default_factory=list)
    ttfts: list[float] = field(default_factory=list)
    errors: int = 0


def prompt(stream: int, n: int) -> str:
    return f"Caller {stream}, question {n}: what happened at the harbour this morning?"


def mmgate_protocol(
    target: str, streams: int, model: str, max_tokens: int, *, token_ids: bool = False
) -> Callable[[int, int], Messages]:
    """A chat turn a request, which the server renders and tokenizes; or (``token_ids``) the
    same turn's token ids, as vLLM's gRPC servicer is sent them (eight prompts a stream)."""
    stubs = [
        inference_pb2_grpc.InferenceStub(connection(target))
        for _ in range(-(-streams // STREAMS_PER_CONNECTION))
    ]
    ids_of = prompt_token_ids(model) if token_ids else None

    async def send(stream: int, n: int) -> Messages:
        stub = stubs[stream % len(stubs)]
        if ids_of is None:
            request = build_request(
                prompt(stream, n), max_tokens=max_tokens, temperature=0.0, ignore_eos=True
            )
        else:
            request = build_request(
                token_ids=ids_of(stream, n % 8),
                max_tokens=max_tokens,
                temperature=0.0,
                ignore_eos=True,
            )
        async for event in stub.Generate(request, timeout=120):
            if event.HasField("delta"):
                yield len(event.delta.token_ids)

    return send


def prompt_token_ids(model: str) -> Callable[[int, int], list[int]]:
    """A stream's n-th chat turn as token ids (the model's chat template), made once each."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)

    @functools.cache
    def token_ids(stream: int, n: int) -> list[int]:
        return chat_token_ids(tokenizer, prompt(stream, n))

    return token_ids


def vllm_grpc_protocol(
    target: str, streams: int, model: str, max_tokens: int
) -> Callable[[int, int], Messages]:
    from smg_grpc_proto import vllm_engine_pb2 as pb
    from smg_grpc_proto import vllm_engine_pb2_grpc

    stubs = [
        vllm_engine_pb2_grpc.VllmEngineStub(connection(target))
        for _ in range(-(-streams // STREAMS_PER_CONNECTION))
    ]
    token_ids = prompt_token_ids(model)

    async def send(stream: int, n: int) -> Messages:
        # this server takes token ids: eight prompts a stream, tokenized once here
        request = pb.GenerateRequest(
            request_id=uuid.uuid4().hex,
            tokenized=pb.TokenizedInput(input_ids=token_ids(stream, n % 8)),
            sampling_params=pb.SamplingParams(
                temperature=0.0, max_tokens=max_tokens, ignore_eos=True
            ),
            stream=True,
        )
        async for response in stubs[stream % len(stubs)].Generate(request, timeout=120):
            if response.HasField("chunk") and response.chunk.token_ids:
                yield len(response.chunk.token_ids)

    return send


def openai_protocol(
    target: str, streams: int, model: str, max_tokens: int
) -> Callable[[int, int], Messages]:
    client = httpx.AsyncClient(
        base_url=f"http://{target}",
        timeout=120,
        limits=httpx.Limits(max_connections=streams, max_keepalive_connections=streams),
    )

    async def send(stream: int, n: int) -> Messages:
        body = {
            "model": model.rstrip("/").rsplit("/", 1)[-1],
            "messages": [{"role": "user", "content": prompt(stream, n)}],
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "ignore_eos": True,
            "stream": True,
            "return_token_ids": True,
        }
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            response.raise_for_status()
            async for line in response.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                chunk = json.loads(line[6:])
                for choice in chunk.get("choices", ()):
                    tokens = len(choice.get("token_ids") or ())
                    if tokens:
                        yield tokens

    return send


Protocol = Callable[[str, int, str, int], Callable[[int, int], Messages]]
PROTOCOLS: dict[str, Protocol] = {
    "mmgate": mmgate_protocol,
    "mmgate-ids": functools.partial(mmgate_protocol, token_ids=True),
    "vllm-grpc": vllm_grpc_protocol,
    "openai": openai_protocol,
}


def connection(target: str) -> grpc.aio.Channel:
    """A channel with a connection of its own (not shared through grpc's subchannel pool)."""
    return grpc.aio.insecure_channel(
        target, options=[("grpc.use_local_subchannel_pool", 1), ("grpc.enable_retries", 0)]
    )


async def stream_loop(
    stream: int, send: Callable[[int, int], Messages], window: Window, stop: float
) -> None:
    n = 0
    while time.perf_counter() < stop:
        n += 1
        sent = time.perf_counter()
        last: float | None = None
        try:
            async for tokens in send(stream, n):
                now = time.perf_counter()
                if window.start <= now < window.end:
                    window.tokens += tokens
                    window.messages += 1
                    if last is None:
                        window.ttfts.append(now - sent)
                    else:
                        window.gaps.append(now - last)
                last = now
        except (grpc.aio.AioRpcError, httpx.HTTPError):
            window.errors += 1
            continue
        if window.start <= time.perf_counter() < window.end:
            window.requests += 1


async def run(args: argparse.Namespace) -> dict[str, Any]:
    send = PROTOCOLS[args.protocol](args.target, args.streams, args.model, args.max_tokens)
    begun = time.perf_counter()
    window = Window(begun + args.warmup, begun + args.warmup + args.seconds)
    stop = window.end
    loops = [asyncio.create_task(stream_loop(i, send, window, stop)) for i in range(args.streams)]
    await asyncio.sleep(max(0.0, window.start - time.perf_counter()))
    cpu, server_cpus = time.process_time(), [process_cpu_seconds(p) for p in args.server_pid]
    await asyncio.sleep(max(0.0, window.end - time.perf_counter()))
    cpu = time.process_time() - cpu
    server_cpus = [
        process_cpu_seconds(p) - s for p, s in zip(args.server_pid, server_cpus, strict=True)
    ]
    # the streams end with their current request (their last messages fall outside the window)
    await asyncio.wait(loops, timeout=150)
    return {
        "seconds": args.seconds,
        "tokens": window.tokens,
        "messages": window.messages,
        "requests": window.requests,
        "errors": window.errors,
        "itl_p50": percentile(window.gaps, 0.5),
        "itl_p99": percentile(window.gaps, 0.99),
        "ttft_p50": percentile(window.ttfts, 0.5),
        "ttft_p99": percentile(window.ttfts, 0.99),
        "client_cpu": cpu,
        "server_cpu": sum(server_cpus),
        "core_cpu": server_cpus[0],  # the first process's: with edges, the core's
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--protocol", choices=sorted(PROTOCOLS), required=True)
    parser.add_argument("--target", required=True)
    parser.add_argument("--streams", type=int, required=True)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--model", required=True)
    parser.add_argument(
        "--server-pid",
        type=int,
        action="append",
        required=True,
        help="the server's process (its CPU is counted); again for each of its front's others",
    )
    parser.add_argument("--max-tokens", type=int, default=128)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(run(args))), flush=True)


if __name__ == "__main__":
    main()
