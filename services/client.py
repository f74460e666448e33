"""mmgate's Python client, for internal services: ``MmgateClient`` (asyncio) and ``SyncClient``.

    async with MmgateClient("127.0.0.1:50051") as client:
        async for text in client.stream_text("What is the capital of France?", max_tokens=32):
            print(text, end="")
        answer = await client.complete("Name a prime.", temperature=0.0)

A string is sent as one user turn of a chat (the model's chat template applies); pass
``messages=[("system", ...), ("user", ...)]`` for more turns, or ``raw=True`` to send the string
to the model as is.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Sequence
from types import TracebackType
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from .inference import TENANT_HEADER
from .proto.mmgate.v1 import cache_pb2, cache_pb2_grpc, inference_pb2, inference_pb2_grpc

DEFAULT_TARGET = "127.0.0.1:50051"
CACHE_POLICIES = {
    "prompt": inference_pb2.CACHE_POLICY_UNSPECIFIED,
    "response": inference_pb2.CACHE_POLICY_RESPONSE,
    "bypass": inference_pb2.CACHE_POLICY_BYPASS,
}


def build_request(
    prompt: str | None = None,
    *,
    messages: Sequence[tuple[str, str]] | None = None,
    raw: bool = False,
    request_id: str = "",
    cache_policy: str = "prompt",
    **sampling: Any,
) -> inference_pb2.GenerateRequest:
    """A GenerateRequest; ``sampling`` takes SamplingParams' fields (max_tokens, temperature...)."""
    request = inference_pb2.GenerateRequest(
        request_id=request_id,
        cache_policy=CACHE_POLICIES[cache_policy],
        sampling=inference_pb2.SamplingParams(
            **{k: v for k, v in sampling.items() if v is not None}
        ),
    )
    if raw:
        request.prompt = prompt or ""
    else:
        turns = list(messages or []) + ([("user", prompt)] if prompt is not None else [])
        request.chat.messages.extend(
            inference_pb2.ChatMessage(role=role, content=content) for role, content in turns
        )
    return request


def _metadata(tenant: str | None) -> tuple[tuple[str, str], ...]:
    return ((TENANT_HEADER, tenant),) if tenant else ()


class MmgateClient:
    """An asyncio client over one channel; every call has a deadline (``timeout`` seconds)."""

    def __init__(
        self,
        target: str = DEFAULT_TARGET,
        *,
        tenant: str | None = None,
        timeout: float = 120.0,
        channel: grpc.aio.Channel | None = None,
    ) -> None:
        self.channel = channel or grpc.aio.insecure_channel(target)
        self.timeout = timeout
        self.metadata = _metadata(tenant)
        self.inference = inference_pb2_grpc.InferenceStub(self.channel)
        self.cache = cache_pb2_grpc.CacheStub(self.channel)
        self.health_stub = health_pb2_grpc.HealthStub(self.channel)

    async def __aenter__(self) -> MmgateClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        await self.channel.close()

    def generate(
        self, request: inference_pb2.GenerateRequest, *, timeout: float | None = None
    ) -> AsyncIterator[inference_pb2.GenerateResponse]:
        """The raw stream: deltas, then one final message."""
        call: AsyncIterator[inference_pb2.GenerateResponse] = self.inference.Generate(
            request, timeout=timeout or self.timeout, metadata=self.metadata
        )
        return call

    async def stream_text(self, prompt: str | None = None, **options: Any) -> AsyncIterator[str]:
        async for event in self.generate(build_request(prompt, **options)):
            if event.HasField("delta"):
                yield event.delta.text

    async def complete(
        self, prompt: str | None = None, *, timeout: float | None = None, **options: Any
    ) -> inference_pb2.CompleteResponse:
        return await self.complete_request(build_request(prompt, **options), timeout=timeout)

    async def complete_request(
        self, request: inference_pb2.GenerateRequest, *, timeout: float | None = None
    ) -> inference_pb2.CompleteResponse:
        response: inference_pb2.CompleteResponse = await self.inference.Complete(
            request, timeout=timeout or self.timeout, metadata=self.metadata
        )
        return response

    async def stats(self) -> cache_pb2.GetStatsResponse:
        response: cache_pb2.GetStatsResponse = await self.cache.GetStats(
            cache_pb2.GetStatsRequest(), timeout=self.timeout, metadata=self.metadata
        )
        return response

    async def inspect(self, key: str) -> cache_pb2.InspectResponse:
        response: cache_pb2.InspectResponse = await self.cache.Inspect(
            cache_pb2.InspectRequest(key=key), timeout=self.timeout, metadata=self.metadata
        )
        return response

    async def invalidate(self, key: str) -> bool:
        response: cache_pb2.InvalidateResponse = await self.cache.Invalidate(
            cache_pb2.InvalidateRequest(key=key), timeout=self.timeout, metadata=self.metadata
        )
        return response.removed

    async def health(self, service: str = "") -> int:
        response: health_pb2.HealthCheckResponse = await self.health_stub.Check(
            health_pb2.HealthCheckRequest(service=service), timeout=self.timeout
        )
        status: int = response.status
        return status


class SyncClient:
    """The same calls for code without an event loop."""

    def __init__(
        self, target: str = DEFAULT_TARGET, *, tenant: str | None = None, timeout: float = 120.0
    ) -> None:
        self.channel = grpc.insecure_channel(target)
        self.timeout = timeout
        self.metadata = _metadata(tenant)
        self.inference = inference_pb2_grpc.InferenceStub(self.channel)
        self.cache = cache_pb2_grpc.CacheStub(self.channel)

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.channel.close()

    def stream_text(self, prompt: str | None = None, **options: Any) -> Iterator[str]:
        stream = self.inference.Generate(
            build_request(prompt, **options), timeout=self.timeout, metadata=self.metadata
        )
        for event in stream:
            if event.HasField("delta"):
                yield event.delta.text

    def complete(self, prompt: str | None = None, **options: Any) -> inference_pb2.CompleteResponse:
        response: inference_pb2.CompleteResponse = self.inference.Complete(
            build_request(prompt, **options), timeout=self.timeout, metadata=self.metadata
        )
        return response

    def stats(self) -> cache_pb2.GetStatsResponse:
        response: cache_pb2.GetStatsResponse = self.cache.GetStats(
            cache_pb2.GetStatsRequest(), timeout=self.timeout, metadata=self.metadata
        )
        return response
