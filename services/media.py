"""The media pipeline: a request's images become what the engine takes, each stage a cache flight.

    pb.Image (bytes | digest) ── digest (SHA-256 of the bytes) ──┐
                                                                 ▼
    "image" stage      sniff, check bytes and pixels before decoding, decode, RGB   (thread)
                       DecodedImage, cached; a digest with no bytes can only hit: NOT_FOUND
                                                                 │
    "embedding" stage  (embeddings mode) the model's processor, vision tower and    (thread)
                       projector, run by mmgate: Embedding, cached
                                                                 ▼
    EngineImages(form, items, uuids = digests) ──▶ engine: multi_modal_data + multi_modal_uuids

Each stage is a cache-actor flight keyed by model + stage settings + digest, for the caller's
tenant: two requests with the same image decode and encode it once, together or an hour apart.
A flight started by a reference (no bytes) fails with ImageNotHeld and is not stored; a request
that has the bytes and joined such a flight tries once more with its own.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal, final

from PIL import Image

from cache_actor import CacheActor, Lookup

from .encoder import tensor_nbytes
from .observers import stage
from .prompts import cache_key
from .proto.mmgate.v1 import inference_pb2 as pb
from .spans import span
from .validation import InvalidRequest, Violation

if TYPE_CHECKING:
    from .config import MediaSettings
    from .encoder import VisionEncoder

log = logging.getLogger("mmgate.media")

MediaForm = Literal["embeddings", "pixels"]
MediaMode = Literal["embeddings", "pixels", "none"]

DIGEST_PREFIX: Final = "sha256:"
# mime type -> Pillow's format name; nothing else is decoded (Pillow knows ~40 formats, each a
# parser an attacker could aim at)
FORMATS: Final = {"image/png": "PNG", "image/jpeg": "JPEG", "image/webp": "WEBP"}
# hashing a large image on the loop would stall it: beyond this, hash in a thread
_HASH_IN_THREAD_BYTES: Final = 256 * 1024


class ImageNotHeld(LookupError):
    """A request referred to an image by digest, and this server does not hold it (any more)."""

    def __init__(self, digest: str, index: int) -> None:
        super().__init__(f"images[{index}]: image {digest} is not held here; send its bytes")
        self.digest = digest
        self.index = index


def digest_of(data: bytes) -> str:
    return DIGEST_PREFIX + hashlib.sha256(data).hexdigest()


def sniff(data: bytes) -> str | None:
    """The mime type the bytes start like, among the supported ones."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if data.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return None


class ImageRejected(ValueError):
    """The bytes are not an image mmgate will decode; the message says why."""


def decode(data: bytes, mime_type: str, *, max_pixels: int, min_side: int) -> Image.Image:
    """Decode one image to RGB, refusing what is too large before any pixel is decoded."""
    sniffed = sniff(data)
    if sniffed is None:
        raise ImageRejected("not a PNG, JPEG or WebP image")
    if mime_type and mime_type != sniffed:
        raise ImageRejected(f"mime_type says {mime_type}, the bytes are {sniffed}")
    try:
        # Image.open reads the header only; Pillow's own bomb check runs there, against
        # Image.MAX_IMAGE_PIXELS (set by MediaPipeline), and decoding waits for load()
        with Image.open(io.BytesIO(data), formats=[FORMATS[sniffed]]) as image:
            width, height = image.size
            if width * height > max_pixels:
                raise ImageRejected(
                    f"{width}x{height} = {width * height} pixels; the limit is {max_pixels}"
                )
            if min(width, height) < min_side:
                raise ImageRejected(f"{width}x{height} pixels; each side needs {min_side} or more")
            image.load()
            return image.convert("RGB")
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise ImageRejected(f"decompression bomb refused: {exc}") from None
    except (OSError, SyntaxError, ValueError, EOFError) as exc:
        if isinstance(exc, ImageRejected):
            raise
        raise ImageRejected(f"corrupt {sniffed} image: {exc}") from None


@final
@dataclass(frozen=True, slots=True)
class DecodedImage:
    image: Image.Image
    digest: str

    @property
    def nbytes(self) -> int:
        width, height = self.image.size
        return width * height * 3


@final
@dataclass(frozen=True, slots=True)
class Embedding:
    """The encoder's output for one image: a tensor of (image tokens, hidden size)."""

    tensor: Any

    @property
    def nbytes(self) -> int:
        return tensor_nbytes(self.tensor)


@final
@dataclass(frozen=True, slots=True)
class EngineImages:
    """A request's images as the engine takes them, with their digests as vLLM's uuids."""

    form: MediaForm
    items: tuple[Any, ...]
    uuids: tuple[str, ...]


@final
@dataclass(frozen=True, slots=True)
class PreparedImages:
    engine: EngineImages
    reports: tuple[pb.ImageReport, ...]


@final
@dataclass(slots=True)
class MediaStats:
    """What the pipeline did itself: work the cache saved shows as work not done here."""

    decodes: int = 0
    decode_seconds: float = 0.0
    encodes: int = 0
    encode_seconds: float = 0.0
    rejected: int = 0
    not_held: int = 0


# Called inside the image stage's flight with each freshly decoded image (logging, statistics).
DecodeObserver = Callable[[DecodedImage, str], Awaitable[None]]


@final
class MediaPipeline:
    def __init__(
        self,
        settings: MediaSettings,
        cache: CacheActor[Any],
        model_name: str,
        encoder: VisionEncoder | None,
        *,
        takes_images: bool,
    ) -> None:
        self.settings = settings
        self.cache = cache
        self.model_name = model_name
        self.encoder = encoder
        self.mode: MediaMode = (
            "none" if not takes_images else "embeddings" if encoder is not None else "pixels"
        )
        self.stats = MediaStats()
        self.observers: list[DecodeObserver] = []
        # Pillow's bomb check: warn beyond this, refuse beyond twice this (process-wide)
        Image.MAX_IMAGE_PIXELS = settings.max_image_pixels

    # ── keys ────────────────────────────────────────────────────────────────────────────────

    def image_key(self, digest: str) -> str:
        return cache_key(self.model_name, "image", {"digest": digest, "mode": "RGB"})

    def embedding_key(self, digest: str) -> str:
        assert self.encoder is not None
        # the model's name stands for its tower, feature layer and projector; dtype is ours
        settings = {"dtype": str(self.encoder.dtype), "tokens": self.encoder.image_tokens}
        return cache_key(self.model_name, "embedding", {"digest": digest, **settings})

    def stage_keys(self, digest: str) -> dict[str, str]:
        """Every cache key an image may be held under, by stage."""
        keys = {"image": self.image_key(digest)}
        if self.encoder is not None:
            keys["embedding"] = self.embedding_key(digest)
        return keys

    # ── requests ────────────────────────────────────────────────────────────────────────────

    async def prepare(
        self, images: Sequence[pb.Image], tenant: str, timeout: float
    ) -> PreparedImages:
        """All of a request's images, concurrently; the first failure (by index) is raised."""
        form: MediaForm = "embeddings" if self.mode == "embeddings" else "pixels"
        tasks = [
            asyncio.ensure_future(self.image(index, image, tenant, timeout))
            for index, image in enumerate(images)
        ]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        finally:
            # on a failure or cancellation the others stop waiting; their flights go on in the
            # actor and land in the cache for the next request
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        for task in tasks:
            if not task.cancelled() and (error := task.exception()) is not None:
                raise error
        results = [task.result() for task in tasks]
        return PreparedImages(
            engine=EngineImages(
                form=form,
                items=tuple(item for item, _ in results),
                uuids=tuple(report.digest for _, report in results),
            ),
            reports=tuple(report for _, report in results),
        )

    async def image(
        self, index: int, image: pb.Image, tenant: str, timeout: float
    ) -> tuple[Any, pb.ImageReport]:
        """One image through its stages: (what the engine takes, where it came from)."""
        deadline = time.monotonic() + timeout
        data = image.data if image.WhichOneof("source") == "data" else None
        if data is None:
            digest = image.digest
        elif len(data) > _HASH_IN_THREAD_BYTES:
            digest = await asyncio.to_thread(digest_of, data)
        else:
            digest = digest_of(data)
        source = _Source(index, digest, data, image.mime_type)
        try:
            lookup = await self._lookup(source, tenant, deadline)
        except ImageNotHeld:
            if data is None:
                self.stats.not_held += 1
                raise
            # a reference-only request started the flight this one joined: try with the bytes
            lookup = await self._lookup(source, tenant, deadline)
        value = lookup.value
        item = value.tensor if isinstance(value, Embedding) else value.image
        report = pb.ImageReport(
            digest=digest,
            outcome=lookup.outcome.value,
            tier=lookup.tier or "",
            form="embeddings" if isinstance(value, Embedding) else "pixels",
        )
        return item, report

    async def _lookup(
        self, source: _Source, tenant: str, deadline: float
    ) -> Lookup[DecodedImage] | Lookup[Embedding]:
        if self.encoder is None:
            return await self._decoded(source, tenant, deadline)
        encoder = self.encoder

        async def encode() -> Embedding:
            decoded = (await self._decoded(source, tenant, deadline)).value
            started = time.perf_counter()
            with span("media.encode", {"mmgate.image.tokens": encoder.image_tokens}):
                tensor = (await asyncio.to_thread(encoder.encode, [decoded.image]))[0]
            self.stats.encodes += 1
            self.stats.encode_seconds += time.perf_counter() - started
            return Embedding(tensor)

        with stage("embedding"):
            lookup: Lookup[Embedding] = await self.cache.get(
                self.embedding_key(source.digest), encode, tenant=tenant, timeout=_left(deadline)
            )
        return lookup

    async def _decoded(self, source: _Source, tenant: str, deadline: float) -> Lookup[DecodedImage]:
        settings = self.settings

        async def load() -> DecodedImage:
            if source.data is None:
                raise ImageNotHeld(source.digest, source.index)
            started = time.perf_counter()
            try:
                with span("media.decode", {"mmgate.image.bytes": len(source.data)}):
                    image = await asyncio.to_thread(
                        decode,
                        source.data,
                        source.mime_type,
                        max_pixels=settings.max_image_pixels,
                        min_side=settings.min_image_side,
                    )
            except ImageRejected as exc:
                self.stats.rejected += 1
                raise InvalidRequest([Violation(f"images[{source.index}]", str(exc))]) from None
            self.stats.decodes += 1
            self.stats.decode_seconds += time.perf_counter() - started
            decoded = DecodedImage(image, source.digest)
            for observe in self.observers:
                await observe(decoded, tenant)
            return decoded

        with stage("image"):
            lookup: Lookup[DecodedImage] = await self.cache.get(
                self.image_key(source.digest), load, tenant=tenant, timeout=_left(deadline)
            )
        return lookup

    async def prefetch(self, image: pb.Image, tenant: str, timeout: float) -> pb.ImageReport:
        _, report = await self.image(0, image, tenant, timeout)
        return report


@final
@dataclass(frozen=True, slots=True)
class _Source:
    index: int
    digest: str
    data: bytes | None
    mime_type: str


def _left(deadline: float) -> float:
    return max(0.0, deadline - time.monotonic())


__all__ = [
    "DIGEST_PREFIX",
    "FORMATS",
    "DecodeObserver",
    "DecodedImage",
    "Embedding",
    "EngineImages",
    "ImageNotHeld",
    "ImageRejected",
    "MediaMode",
    "MediaPipeline",
    "MediaStats",
    "PreparedImages",
    "decode",
    "digest_of",
    "sniff",
]
