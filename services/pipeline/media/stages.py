"""The media stage: a request's images become what the engine takes, each step a cache flight.

    ImageInput (bytes | digest) ── digest (SHA-256 of the bytes) ──┐
                                                                   ▼
    "image" flight      sniff, check bytes and pixels before decoding, decode, RGB   (thread)
                        DecodedImage, cached; a digest with no bytes can only hit: NOT_FOUND
                                                                   │
    "embedding" flight  (EmbeddingsStage) the model's processor, vision tower and    (thread)
                        projector, run by mmgate, images waiting together in one batch
                        (batching.py): Embedding, cached
                                                                   ▼
    EngineImages(form, items, uuids = digests) ──▶ engine: multi_modal_data + multi_modal_uuids

One variant per media mode, chosen once when the engine has started (:func:`media_stage`, from
the plan in plan.py):

    NoImages          a text model: images are refused (FAILED_PRECONDITION)
    PixelsStage       decoded images cached; the engine encodes them
    EmbeddingsStage   encoder outputs cached too; the engine takes them as they are

Each flight is keyed by model + stage settings + digest, for the caller's tenant: two requests with
the same image decode and encode it once, together or an hour apart. A flight started by a
reference (no bytes) fails with ImageNotHeld and is not stored; a request that has the bytes and
joined such a flight tries once more with its own.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Final, final

from PIL import Image

from cache_actor import Lookup, Stage

from ...config import MediaSettings
from ...engine.tensors import tensor_nbytes
from ...errors import (
    ImageNotHeld,
    ImageRejected,
    InvalidRequest,
    ModelTakesNoImages,
    Violation,
)
from ...keys import cache_key
from ...observability.spans import span
from ...types import EngineImages, ImageInput, ImageReport, MediaForm, MediaStats
from ...wire import digest_of
from ..cache_front import CacheFront, outcome_of
from ..chaos import NoChaos
from ..request import seconds_left
from ..threads import ThreadPools
from .batching import EncodeBatcher
from .codec import DecodedImage, decode
from .fetch import ImageFetcher

if TYPE_CHECKING:
    from ...engine.encoder import VisionEncoder

# An image as the model's processor will resize it (services/engine/shrink.py), handed in by
# the server; None: stored as decoded.
Shrink = Callable[[Image.Image], Image.Image]


log = logging.getLogger("mmgate.media")

# hashing a large image on the loop would stall it: beyond this, hash in a thread
_HASH_IN_THREAD_BYTES: Final = 256 * 1024


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
class PreparedImages:
    engine: EngineImages
    reports: tuple[ImageReport, ...]


class MediaStage:
    """What the pipeline asks of images, whatever the media mode."""

    mode: ClassVar[str]
    description: ClassVar[str]
    takes_images: ClassVar[bool] = True

    fetcher: ImageFetcher | None = None  # images by URL, where the model takes images

    def __init__(self) -> None:
        self.stats = MediaStats()

    @property
    def placeholder_tokens(self) -> int:
        """The positions one image placeholder takes in the engine's prompt."""
        return 1

    def refuse(self) -> None:
        """Raise why images cannot be served here; nothing when they can."""

    async def prepare(
        self, images: Sequence[ImageInput], tenant: str, deadline: float
    ) -> PreparedImages:
        """All of a request's images, concurrently, by ``deadline`` (``time.monotonic()``); the
        first failure (by index) is raised."""
        self.refuse()
        raise NotImplementedError

    async def prefetch(self, image: ImageInput, tenant: str, deadline: float) -> ImageReport:
        """One image through its stages, for requests that will refer to it by digest."""
        self.refuse()
        raise NotImplementedError

    def stage_keys(self, digest: str) -> dict[Stage, str]:
        """Every cache key an image may be held under, by stage."""
        self.refuse()
        return {}


@final
class NoImages(MediaStage):
    mode = "none"
    description = "the model takes no images"
    takes_images = False

    def __init__(self, model_name: str) -> None:
        super().__init__()
        self.model_name = model_name

    def refuse(self) -> None:
        raise ModelTakesNoImages(self.model_name)

    def stage_keys(self, digest: str) -> dict[Stage, str]:
        # nothing is ever held under it, but the answer stays "absent", not an error
        return {Stage.IMAGE: _image_key(self.model_name, digest)}


class PixelsStage(MediaStage):
    """Decoded images are cached; the engine runs the vision encoder on them."""

    mode = "pixels"
    description = "mmgate caches decoded images; the engine encodes them"
    form: ClassVar[MediaForm] = "pixels"

    def __init__(
        self,
        settings: MediaSettings,
        cache: CacheFront,
        model_name: str,
        *,
        placeholder_tokens: int,
        threads: ThreadPools,
        shrink: Shrink | None = None,
        chaos: NoChaos | None = None,
    ) -> None:
        super().__init__()
        self.settings = settings
        self.cache = cache
        self.model_name = model_name
        self.threads = threads
        self.chaos = chaos if chaos is not None else NoChaos()
        # what the cache stores of a decoded image: the processor's size, where exact
        self.shrink = shrink
        self.fetcher: ImageFetcher = ImageFetcher(settings, cache)
        self._placeholder_tokens = placeholder_tokens
        # Pillow's bomb check: warn beyond this, refuse beyond twice this (process-wide)
        Image.MAX_IMAGE_PIXELS = settings.max_image_pixels

    @property
    def placeholder_tokens(self) -> int:
        return self._placeholder_tokens

    def stage_keys(self, digest: str) -> dict[Stage, str]:
        return {Stage.IMAGE: _image_key(self.model_name, digest)}

    async def prepare(
        self, images: Sequence[ImageInput], tenant: str, deadline: float
    ) -> PreparedImages:
        tasks = [asyncio.ensure_future(self._image(image, tenant, deadline)) for image in images]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        finally:
            # on a failure or cancellation the others stop waiting; their decode and encode
            # flights go on in the actor and land in the cache for the next request (a URL's
            # fetch with no waiter left stops: fetch.py)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        for task in tasks:
            if not task.cancelled() and (error := task.exception()) is not None:
                raise error
        results = [task.result() for task in tasks]
        return PreparedImages(
            engine=EngineImages(
                form=self.form,
                items=tuple(item for item, _ in results),
                uuids=tuple(report.digest for _, report in results),
            ),
            reports=tuple(report for _, report in results),
        )

    async def prefetch(self, image: ImageInput, tenant: str, deadline: float) -> ImageReport:
        _, report = await self._image(image, tenant, deadline)
        return report

    async def _image(
        self, image: ImageInput, tenant: str, deadline: float
    ) -> tuple[Any, ImageReport]:
        """One image through its stages: (what the engine takes, where it came from)."""
        if image.url:
            fetched = await self.fetcher.fetch(image.index, image.url, tenant, deadline)
            try:
                return await self._image(
                    ImageInput(image.index, fetched.data, mime_type=image.mime_type),
                    tenant,
                    deadline,
                )
            except InvalidRequest:
                # bytes that are no image are not kept for the URL either
                await self.fetcher.forget(image.url, tenant)
                raise
        data = image.data
        if data is None:
            source = image
        else:
            digest = (
                await self.threads.run("hash", digest_of, data)
                if len(data) > _HASH_IN_THREAD_BYTES
                else digest_of(data)
            )
            source = ImageInput(image.index, data, digest, image.mime_type)
        try:
            lookup = await self._lookup(source, tenant, deadline)
        except ImageNotHeld:
            if data is None:
                self.stats.not_held += 1
                raise
            # a reference-only request started the flight this one joined: try with the bytes
            lookup = await self._lookup(source, tenant, deadline)
        report = ImageReport(
            digest=source.digest,
            outcome=outcome_of(lookup)[0],
            tier=lookup.tier or "",
            form=self.form,
        )
        return self._engine_item(lookup.value), report

    def _engine_item(self, value: Any) -> Any:
        assert isinstance(value, DecodedImage)
        return value.image

    async def _lookup(self, source: ImageInput, tenant: str, deadline: float) -> Lookup[Any]:
        return await self._decoded(source, tenant, deadline)

    async def _decoded(
        self, source: ImageInput, tenant: str, deadline: float
    ) -> Lookup[DecodedImage]:
        settings = self.settings

        async def load() -> DecodedImage:
            if source.data is None:
                raise ImageNotHeld(source.digest, source.index)
            await self.chaos.inject("decode", tenant)
            started = time.perf_counter()
            try:
                with span("media.decode", {"mmgate.image.bytes": len(source.data)}):
                    image = await self.threads.run(
                        "decode",
                        functools.partial(
                            _decode,
                            max_pixels=settings.max_image_pixels,
                            min_side=settings.min_image_side,
                            shrink=self.shrink,
                        ),
                        source.data,
                        source.mime_type,
                    )
            except ImageRejected as exc:
                self.stats.rejected += 1
                raise InvalidRequest([Violation(f"images[{source.index}]", str(exc))]) from None
            self.stats.decodes += 1
            self.stats.decode_seconds += time.perf_counter() - started
            return DecodedImage(image, source.digest)

        return await self.cache.get(
            _image_key(self.model_name, source.digest),
            load,
            tenant=tenant,
            timeout=seconds_left(deadline),
            tier=Stage.IMAGE.tier_use,
            label=source.digest,
        )


@final
class EmbeddingsStage(PixelsStage):
    """Encoder outputs are cached too: mmgate runs the vision encoder, the engine takes them."""

    mode = "embeddings"
    description = "mmgate runs the vision encoder and caches its output"
    form: ClassVar[MediaForm] = "embeddings"

    def __init__(
        self,
        settings: MediaSettings,
        cache: CacheFront,
        model_name: str,
        encoder: VisionEncoder,
        *,
        threads: ThreadPools,
        shrink: Shrink | None = None,
        chaos: NoChaos | None = None,
    ) -> None:
        super().__init__(
            settings,
            cache,
            model_name,
            placeholder_tokens=encoder.image_tokens,
            threads=threads,
            shrink=shrink,
            chaos=chaos,
        )
        self.encoder = encoder
        self.batcher = EncodeBatcher(
            encoder.encode,
            threads,
            max_batch=settings.encode_batch,
            window_seconds=settings.encode_window_ms / 1000,
            stats=self.stats,
        )

    def embedding_key(self, digest: str) -> str:
        # the model's name stands for its tower, feature layer and projector; dtype is ours
        settings = {"dtype": str(self.encoder.dtype), "tokens": self.encoder.image_tokens}
        return cache_key(self.model_name, Stage.EMBEDDING, {"digest": digest, **settings})

    def stage_keys(self, digest: str) -> dict[Stage, str]:
        return {**super().stage_keys(digest), Stage.EMBEDDING: self.embedding_key(digest)}

    def _engine_item(self, value: Any) -> Any:
        assert isinstance(value, Embedding)
        return value.tensor

    async def _lookup(self, source: ImageInput, tenant: str, deadline: float) -> Lookup[Any]:
        encoder = self.encoder

        async def encode() -> Embedding:
            decoded = (await self._decoded(source, tenant, deadline)).value
            await self.chaos.inject("encode", tenant)
            started = time.perf_counter()
            with span("media.encode", {"mmgate.image.tokens": encoder.image_tokens}) as traced:
                tensor, batch = await self.batcher.encode(decoded.image)
                if traced is not None:
                    traced.set_attribute("mmgate.encode.batch", batch)
            self.stats.encodes += 1
            self.stats.encode_seconds += time.perf_counter() - started
            return Embedding(tensor)

        return await self.cache.get(
            self.embedding_key(source.digest),
            encode,
            tenant=tenant,
            timeout=seconds_left(deadline),
            tier=Stage.EMBEDDING.tier_use,
            label=source.digest,
        )


def media_stage(
    settings: MediaSettings,
    cache: CacheFront,
    model_name: str,
    *,
    takes_images: bool,
    encoder: VisionEncoder | None,
    placeholder_tokens: int,
    threads: ThreadPools,
    shrink: Shrink | None = None,
    chaos: NoChaos | None = None,
) -> MediaStage:
    """The variant for a started engine: chosen once, never tested for again."""
    if not takes_images:
        return NoImages(model_name)
    if encoder is not None:
        return EmbeddingsStage(
            settings, cache, model_name, encoder, threads=threads, shrink=shrink, chaos=chaos
        )
    return PixelsStage(
        settings,
        cache,
        model_name,
        placeholder_tokens=placeholder_tokens,
        threads=threads,
        shrink=shrink,
        chaos=chaos,
    )


def _decode(
    data: bytes, mime_type: str, *, max_pixels: int, min_side: int, shrink: Shrink | None
) -> Image.Image:
    """In the decode stage's thread: decode, then keep what the processor will use."""
    image = decode(data, mime_type, max_pixels=max_pixels, min_side=min_side)
    return shrink(image) if shrink is not None else image


def _image_key(model_name: str, digest: str) -> str:
    return cache_key(model_name, Stage.IMAGE, {"digest": digest, "mode": "RGB"})


__all__ = [
    "Embedding",
    "EmbeddingsStage",
    "MediaStage",
    "NoImages",
    "PixelsStage",
    "PreparedImages",
    "media_stage",
]
