"""mmgate's Python client, for internal services: ``MmgateClient`` (asyncio) and ``SyncClient``.

    async with MmgateClient("127.0.0.1:50051") as client:
        async for text in client.stream_text("What is the capital of France?", max_tokens=32):
            print(text, end="")
        answer = await client.complete("Name a prime.", temperature=0.0)

    with SyncClient("127.0.0.1:50051") as client:  # the same calls, blocking
        answer = client.complete("Name a prime.", temperature=0.0)

A string is sent as one user turn of a chat (the model's chat template applies); pass
``messages=[("system", ...), ("user", ...)]`` for more turns, or ``raw=True`` to send the string
to the model as is.

Images go as bytes (PNG, JPEG, WebP): ``complete("<image> What is this?", images=[png])``; the
n-th ``<image>`` in the text is the n-th image (with none in the text, they go before the user's
text). Once the server has reported an image's digest, this client sends only the digest; if
the server no longer holds it (NOT_FOUND, reason IMAGE_NOT_FOUND), the client resends the
request with the bytes, once:

    request ── by_reference ──┬── an image held ──► sent by digest ──► NOT_FOUND, IMAGE_NOT_FOUND
                              │                                                │ forget the digests
                              └── none held ──────► sent as built ◄────────────┘ (once)

This module imports grpc, protobuf, the generated stubs and ``wire`` only: a service that only
calls mmgate loads none of the server's dependencies (a test holds it to that).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import AsyncGenerator, AsyncIterator, Generator, Iterator, Sequence
from types import TracebackType
from typing import Any, final

import grpc
from google.rpc import error_details_pb2, status_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc

from .proto.mmgate.v1 import cache_pb2, cache_pb2_grpc, inference_pb2, inference_pb2_grpc
from .wire import IMAGE_NOT_FOUND, IMAGE_PLACEHOLDER, TENANT_HEADER, digest_of

DEFAULT_TARGET = "127.0.0.1:50051"
CACHE_POLICIES = {
    "prompt": inference_pb2.CACHE_POLICY_UNSPECIFIED,
    "response": inference_pb2.CACHE_POLICY_RESPONSE,
    "bypass": inference_pb2.CACHE_POLICY_BYPASS,
}


# digests this client remembers as held by the server, most recent last
HELD_DIGESTS = 4096


def build_request(
    prompt: str | None = None,
    *,
    messages: Sequence[tuple[str, str]] | None = None,
    images: Sequence[bytes] = (),
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
        images=[inference_pb2.Image(data=data) for data in images],
    )
    texts = [prompt or ""] + [content for _, content in messages or ()]
    if images and prompt is not None and not any(IMAGE_PLACEHOLDER in t for t in texts):
        prompt = IMAGE_PLACEHOLDER * len(images) + "\n" + prompt
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


def image_not_found(error: grpc.RpcError) -> bool:
    """The server does not hold an image the request referred to by digest."""
    if error.code() != grpc.StatusCode.NOT_FOUND:
        return False
    for key, value in error.trailing_metadata() or ():
        if key == "grpc-status-details-bin":
            for detail in status_pb2.Status.FromString(value).details:
                info = error_details_pb2.ErrorInfo()
                if detail.Unpack(info) and info.reason == IMAGE_NOT_FOUND:
                    return True
    return False


class HeldImages:
    """The digests the server has reported for this client's images, bounded, most recent last.

    ``by_reference`` swaps the bytes of a held image for its digest; a request that then fails
    with IMAGE_NOT_FOUND is sent again as it was built, with the bytes.
    """

    def __init__(self, capacity: int = HELD_DIGESTS) -> None:
        self.capacity = capacity
        self._digests: OrderedDict[str, None] = OrderedDict()

    def __contains__(self, digest: str) -> bool:
        return digest in self._digests

    def add(self, digest: str) -> None:
        self._digests[digest] = None
        self._digests.move_to_end(digest)
        while len(self._digests) > self.capacity:
            self._digests.popitem(last=False)

    def learn(self, final: inference_pb2.GenerateFinal) -> None:
        for report in final.cache.images:
            self.add(report.digest)

    def by_reference(
        self, request: inference_pb2.GenerateRequest
    ) -> inference_pb2.GenerateRequest | None:
        """The request with held images as digests; None when no image is held."""
        digests = [
            digest_of(image.data) if image.WhichOneof("source") == "data" else ""
            for image in request.images
        ]
        if not any(d in self._digests for d in digests if d):
            return None
        slim = inference_pb2.GenerateRequest()
        slim.CopyFrom(request)
        for image, digest in zip(slim.images, digests, strict=True):
            if digest in self._digests:
                image.digest = digest  # the oneof drops the bytes
        return slim

    def forget(self, request: inference_pb2.GenerateRequest) -> None:
        for image in request.images:
            self._digests.pop(image.digest, None)


@final
class _Attempts:
    """One call's requests, for both clients: ``current`` is sent first (held images as
    digests), and ``resend_with_bytes`` decides, once, whether it goes again as built."""

    __slots__ = ("_held", "_request", "current")

    def __init__(self, held: HeldImages, request: inference_pb2.GenerateRequest) -> None:
        self._held = held
        self._request = request
        slim = held.by_reference(request)
        self.current = request if slim is None else slim

    def resend_with_bytes(self, error: grpc.RpcError, *, streamed: bool = False) -> bool:
        """True, and ``current`` becomes the request with the bytes, when ``current`` went by
        reference and the server no longer holds one of its images; False: raise ``error``.

        ``streamed``: the call already delivered events, which a resend would deliver twice
        (it does not happen: the server prepares images before the first token).
        """
        if self.current is self._request or streamed or not image_not_found(error):
            return False
        self._held.forget(self.current)
        self.current = self._request
        return True


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
        attempts = _Attempts(self.held, request)
        while True:
            streamed = False
            call = self.inference.Generate(
                attempts.current, timeout=timeout or self.timeout, metadata=self.metadata
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
        attempts = _Attempts(self.held, request)
        while True:
            try:
                response: inference_pb2.CompleteResponse = await self.inference.Complete(
                    attempts.current, timeout=timeout or self.timeout, metadata=self.metadata
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
            metadata=self.metadata,
        )
        self.held.add(response.digest)
        return response

    async def stats(self) -> cache_pb2.GetStatsResponse:
        response: cache_pb2.GetStatsResponse = await self.cache.GetStats(
            cache_pb2.GetStatsRequest(), timeout=self.timeout, metadata=self.metadata
        )
        return response

    async def inspect(self, key: str = "", *, digest: str = "") -> cache_pb2.InspectResponse:
        """A cache key's entry, or (``digest``) every stage of an image."""
        response: cache_pb2.InspectResponse = await self.cache.Inspect(
            cache_pb2.InspectRequest(key=key, digest=digest),
            timeout=self.timeout,
            metadata=self.metadata,
        )
        return response

    async def invalidate(self, key: str = "", *, digest: str = "") -> bool:
        """Drop a cache key, or (``digest``) every stage of an image."""
        response: cache_pb2.InvalidateResponse = await self.cache.Invalidate(
            cache_pb2.InvalidateRequest(key=key, digest=digest),
            timeout=self.timeout,
            metadata=self.metadata,
        )
        return response.removed

    async def health(self, service: str = "") -> int:
        response: health_pb2.HealthCheckResponse = await self.health_stub.Check(
            health_pb2.HealthCheckRequest(service=service), timeout=self.timeout
        )
        status: int = response.status
        return status


class SyncClient:
    """``MmgateClient``'s calls for code without an event loop, blocking; every call has a
    deadline (``timeout`` seconds)."""

    def __init__(
        self,
        target: str = DEFAULT_TARGET,
        *,
        tenant: str | None = None,
        timeout: float = 120.0,
        channel: grpc.Channel | None = None,
    ) -> None:
        self.channel = channel or grpc.insecure_channel(target)
        self.timeout = timeout
        self.metadata = _metadata(tenant)
        self.inference = inference_pb2_grpc.InferenceStub(self.channel)
        self.cache = cache_pb2_grpc.CacheStub(self.channel)
        self.health_stub = health_pb2_grpc.HealthStub(self.channel)
        self.held = HeldImages()

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        self.channel.close()

    def generate(
        self, request: inference_pb2.GenerateRequest, *, timeout: float | None = None
    ) -> Generator[inference_pb2.GenerateResponse, None, None]:
        """The raw stream: deltas, then one final message; closing it early (``close()``, or
        leaving a ``for`` loop over it) cancels the call."""
        attempts = _Attempts(self.held, request)
        while True:
            streamed = False
            call = self.inference.Generate(
                attempts.current, timeout=timeout or self.timeout, metadata=self.metadata
            )
            try:
                for event in call:
                    streamed = True
                    if event.HasField("final"):
                        self.held.learn(event.final)
                    yield event
                return
            except grpc.RpcError as error:
                if not attempts.resend_with_bytes(error, streamed=streamed):
                    raise
            finally:
                call.cancel()

    def stream_text(self, prompt: str | None = None, **options: Any) -> Iterator[str]:
        for event in self.generate(build_request(prompt, **options)):
            if event.HasField("delta"):
                yield event.delta.text

    def complete(
        self, prompt: str | None = None, *, timeout: float | None = None, **options: Any
    ) -> inference_pb2.CompleteResponse:
        return self.complete_request(build_request(prompt, **options), timeout=timeout)

    def complete_request(
        self, request: inference_pb2.GenerateRequest, *, timeout: float | None = None
    ) -> inference_pb2.CompleteResponse:
        attempts = _Attempts(self.held, request)
        while True:
            try:
                response: inference_pb2.CompleteResponse = self.inference.Complete(
                    attempts.current, timeout=timeout or self.timeout, metadata=self.metadata
                )
            except grpc.RpcError as error:
                if not attempts.resend_with_bytes(error):
                    raise
            else:
                self.held.learn(response.final)
                return response

    def prefetch(self, data: bytes, mime_type: str = "") -> cache_pb2.PrefetchResponse:
        """Warm the server's cache with an image; later requests send only its digest."""
        response: cache_pb2.PrefetchResponse = self.cache.Prefetch(
            cache_pb2.PrefetchRequest(data=data, mime_type=mime_type),
            timeout=self.timeout,
            metadata=self.metadata,
        )
        self.held.add(response.digest)
        return response

    def stats(self) -> cache_pb2.GetStatsResponse:
        response: cache_pb2.GetStatsResponse = self.cache.GetStats(
            cache_pb2.GetStatsRequest(), timeout=self.timeout, metadata=self.metadata
        )
        return response

    def inspect(self, key: str = "", *, digest: str = "") -> cache_pb2.InspectResponse:
        """A cache key's entry, or (``digest``) every stage of an image."""
        response: cache_pb2.InspectResponse = self.cache.Inspect(
            cache_pb2.InspectRequest(key=key, digest=digest),
            timeout=self.timeout,
            metadata=self.metadata,
        )
        return response

    def invalidate(self, key: str = "", *, digest: str = "") -> bool:
        """Drop a cache key, or (``digest``) every stage of an image."""
        response: cache_pb2.InvalidateResponse = self.cache.Invalidate(
            cache_pb2.InvalidateRequest(key=key, digest=digest),
            timeout=self.timeout,
            metadata=self.metadata,
        )
        return response.removed

    def health(self, service: str = "") -> int:
        response: health_pb2.HealthCheckResponse = self.health_stub.Check(
            health_pb2.HealthCheckRequest(service=service), timeout=self.timeout
        )
        status: int = response.status
        return status


__all__ = [
    "CACHE_POLICIES",
    "DEFAULT_TARGET",
    "HELD_DIGESTS",
    "HeldImages",
    "MmgateClient",
    "SyncClient",
    "build_request",
    "digest_of",
    "image_not_found",
]
