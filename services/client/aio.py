"""``MmgateClient``: mmgate's asyncio client over one channel; every call has a deadline."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from types import TracebackType
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ..proto.mmgate.v1 import cache_pb2, cache_pb2_grpc, inference_pb2, inference_pb2_grpc
from ..wire import AFFINITY_HEADER, digest_of
from .credentials import Credentials
from .requests import DEFAULT_TARGET, Attempts, HeldImages, build_request, tokenize_request


class MmgateClient:
    """An asyncio client over one channel; every call has a deadline (``timeout`` seconds)."""

    def __init__(
        self,
        target: str = DEFAULT_TARGET,
        *,
        tenant: str | None = None,
        credentials: Credentials | None = None,
        timeout: float = 120.0,
        retries: bool = True,
        channel: grpc.aio.Channel | None = None,
    ) -> None:
        credentials = credentials or Credentials()
        # retries: grpc retries UNAVAILABLE before any answer (credentials.RETRY_POLICY)
        self.channel = channel or credentials.aio_channel(target, retries=retries)
        self.timeout = timeout
        self.metadata = credentials.metadata(tenant)
        self.inference = inference_pb2_grpc.InferenceStub(self.channel)
        self.cache = cache_pb2_grpc.CacheStub(self.channel)
        self.health_stub = health_pb2_grpc.HealthStub(self.channel)
        self.held = HeldImages()

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

    async def generate(
        self, request: inference_pb2.GenerateRequest, *, timeout: float | None = None
    ) -> AsyncGenerator[inference_pb2.GenerateResponse, None]:
        """The raw stream: deltas, then one final message; closing it early cancels the call."""
        attempts = Attempts(self.held, request, self.metadata)
        while True:
            streamed = False
            call = self.inference.Generate(
                attempts.current, timeout=timeout or self.timeout, metadata=attempts.metadata
            )
            try:
                async for event in call:
                    streamed = True
                    if event.HasField("final"):
                        self.held.learn(event.final)
                    yield event
                return
            except grpc.aio.AioRpcError as error:
                if not attempts.resend_with_bytes(error, streamed=streamed):
                    raise
            finally:
                # closing this generator early (aclose, break) ends the call on the server
                call.cancel()

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
        attempts = Attempts(self.held, request, self.metadata)
        while True:
            try:
                response: inference_pb2.CompleteResponse = await self.inference.Complete(
                    attempts.current, timeout=timeout or self.timeout, metadata=attempts.metadata
                )
            except grpc.aio.AioRpcError as error:
                if not attempts.resend_with_bytes(error):
                    raise
            else:
                self.held.learn(response.final)
                return response

    async def prefetch(self, data: bytes, mime_type: str = "") -> cache_pb2.PrefetchResponse:
        """Warm the server's cache with an image; later requests send only its digest."""
        response: cache_pb2.PrefetchResponse = await self.cache.Prefetch(
            cache_pb2.PrefetchRequest(data=data, mime_type=mime_type),
            timeout=self.timeout,
            # to the replica its requests will hash to
            metadata=(*self.metadata, (AFFINITY_HEADER, digest_of(data))),
        )
        self.held.add(response.digest)
        return response

    async def model_info(self) -> inference_pb2.ModelInfo:
        """The served model (name, context length, vocabulary, end ids) and the server's limits."""
        response: inference_pb2.ModelInfo = await self.inference.GetModelInfo(
            inference_pb2.GetModelInfoRequest(), timeout=self.timeout, metadata=self.metadata
        )
        return response

    async def server_info(self) -> inference_pb2.ServerInfo:
        """Which replica answered, its version, model, modes and limits."""
        response: inference_pb2.ServerInfo = await self.inference.GetServerInfo(
            inference_pb2.GetServerInfoRequest(), timeout=self.timeout, metadata=self.metadata
        )
        return response

    async def load(self) -> inference_pb2.Load:
        """The replica's load now: what it runs and queues, its KV cache, its caches."""
        response: inference_pb2.Load = await self.inference.GetLoad(
            inference_pb2.GetLoadRequest(), timeout=self.timeout, metadata=self.metadata
        )
        return response

    async def abort(self, *request_ids: str) -> list[str]:
        """End this caller's requests being answered with these ``request_id``s: those ended
        (none: NOT_FOUND)."""
        response: inference_pb2.AbortResponse = await self.inference.Abort(
            inference_pb2.AbortRequest(request_ids=request_ids),
            timeout=self.timeout,
            metadata=self.metadata,
        )
        return list(response.aborted)

    async def tokenize(self, prompt: str | None = None, **input: Any) -> list[int]:
        """The token ids Generate would give the engine for this input: ``prompt`` or
        ``messages`` (and ``tools``), ``raw``, as :func:`build_request` takes them."""
        response: inference_pb2.TokenizeResponse = await self.inference.Tokenize(
            tokenize_request(prompt, **input), timeout=self.timeout, metadata=self.metadata
        )
        return list(response.token_ids)

    async def detokenize(self, token_ids: Sequence[int]) -> str:
        """The text of ``token_ids``, special tokens included."""
        response: inference_pb2.DetokenizeResponse = await self.inference.Detokenize(
            inference_pb2.DetokenizeRequest(token_ids=token_ids),
            timeout=self.timeout,
            metadata=self.metadata,
        )
        return response.text

    async def load_adapter(self, name: str, path: str) -> inference_pb2.LoadAdapterResponse:
        """An admin's: serve the LoRA adapter in ``path`` (under the server's adapter root) as
        ``name``, replacing one of that name."""
        response: inference_pb2.LoadAdapterResponse = await self.inference.LoadAdapter(
            inference_pb2.LoadAdapterRequest(name=name, path=path),
            timeout=self.timeout,
            metadata=self.metadata,
        )
        return response

    async def unload_adapter(self, name: str) -> int:
        """An admin's: stop serving ``name``; the requests still running on it (they finish)."""
        response: inference_pb2.UnloadAdapterResponse = await self.inference.UnloadAdapter(
            inference_pb2.UnloadAdapterRequest(name=name),
            timeout=self.timeout,
            metadata=self.metadata,
        )
        return response.requests_running

    async def stats(self, *, all_tenants: bool = False) -> cache_pb2.GetStatsResponse:
        """The caller's tenant's figures; an admin's: all tenants together, and with
        ``all_tenants`` each tenant's."""
        response: cache_pb2.GetStatsResponse = await self.cache.GetStats(
            cache_pb2.GetStatsRequest(all_tenants=all_tenants),
            timeout=self.timeout,
            metadata=self.metadata,
        )
        return response

    async def inspect(
        self, key: str = "", *, digest: str = "", tenant: str = ""
    ) -> cache_pb2.InspectResponse:
        """A cache key's entry, or (``digest``) every stage of an image."""
        response: cache_pb2.InspectResponse = await self.cache.Inspect(
            cache_pb2.InspectRequest(key=key, digest=digest, tenant=tenant),
            timeout=self.timeout,
            metadata=self.metadata,
        )
        return response

    async def invalidate(self, key: str = "", *, digest: str = "", tenant: str = "") -> bool:
        """Drop a cache key, or (``digest``) every stage of an image."""
        response: cache_pb2.InvalidateResponse = await self.cache.Invalidate(
            cache_pb2.InvalidateRequest(key=key, digest=digest, tenant=tenant),
            timeout=self.timeout,
            metadata=self.metadata,
        )
        return response.removed

    async def watch(
        self,
        since: int = 0,
        *,
        stage: str = "",
        tenant: str = "",
        all_tenants: bool = False,
        timeout: float | None = None,
    ) -> AsyncGenerator[cache_pb2.WatchEvent, None]:
        """What the server's cache does for this tenant: a snapshot ("held" events), or the
        events after ``since`` while the server still has them; "synced"; then each admit,
        evict, expire and invalidate, until a "gap" (resume from its sequence number) or the
        deadline. Closing it early ends the call on the server."""
        call = self.cache.Watch(
            cache_pb2.WatchRequest(
                since=since, stage=stage, tenant=tenant, all_tenants=all_tenants
            ),
            timeout=timeout or self.timeout,
            metadata=self.metadata,
        )
        try:
            async for event in call:
                yield event
        finally:
            call.cancel()

    async def health(self, service: str = "") -> int:
        response: health_pb2.HealthCheckResponse = await self.health_stub.Check(
            health_pb2.HealthCheckRequest(service=service), timeout=self.timeout
        )
        status: int = response.status
        return status


__all__ = ["MmgateClient"]
