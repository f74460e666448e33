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

A request's videos take their own path (videos.py), held by the stage as ``videos``.

One variant per media mode, chosen once when the engine has started (:func:`media_stage`, on the
server's MediaContext, which the plan in plan.py makes):

    NoImages          a text model: images are refused (FAILED_PRECONDITION)
    PixelsStage       decoded images cached; the engine encodes them
    EmbeddingsStage   encoder outputs cached too; the engine takes them as they are

Each flight is keyed by model + stage settings + digest, for the caller's tenant: two requests with
the same image decode and encode it once, together or an hour apart. A flight started by a
reference (no bytes) fails with ImageNotHeld and is not stored; a request that has the bytes and
joined such a flight tries once more with its own.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Final, final

from PIL import Image

from cache_actor import Lookup, Stage

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
from ..cache_front import outcome_of
from ..request import MediaCall
from .batching import EncodeBatcher
from .codec import DecodedImage, decode
from .context import MediaContext, Shrink
from .together import all_or_first_failure
from .videos import NoVideos, Videos, video_stage

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

    def __init__(self, videos: Videos) -> None:
        self.stats = MediaStats()
        self.videos = videos  # the model's clips (videos.py), beside its images

    @property
    def placeholder_tokens(self) -> int:
        """The positions one image placeholder takes in the engine's prompt."""
        return 1

    def refuse(self) -> None:
        """Raise why images cannot be served here; nothing when they can."""

    async def prepare(self, images: Sequence[ImageInput], call: MediaCall) -> PreparedImages:
        """All of a request's images, concurrently, in the call's tenant's namespace and by its
        deadline; the first failure (by index) is raised."""
        self.refuse()
        raise NotImplementedError

    async def prefetch(self, image: ImageInput, call: MediaCall) -> ImageReport:
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

    def __init__(self, model_name: str, videos: Videos | None = None) -> None:
        super().__init__(videos if videos is not None else NoVideos(model_name))
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

    def __init__(self, context: MediaContext, videos: Videos | None = None) -> None:
        super().__init__(videos if videos is not None else NoVideos(context.model_name))
        self.context = context

    @property
    def placeholder_tokens(self) -> int:
        return self.context.placeholder_tokens

    def stage_keys(self, digest: str) -> dict[Stage, str]:
        return {Stage.IMAGE: _image_key(self.context.model_name, digest)}

    async def prepare(self, images: Sequence[ImageInput], call: MediaCall) -> PreparedImages:
        # on a failure the others stop waiting; their decode and encode flights go on in the
        # actor and land in the cache for the next request (a URL's fetch with no waiter left
        # stops: fetch.py)
        results = await all_or_first_failure([self._image(image, call) for image in images])
        return PreparedImages(
            engine=EngineImages(
                form=self.form,
                items=tuple(item for item, _ in results),
                uuids=tuple(report.digest for _, report in results),
            ),
            reports=tuple(report for _, report in results),
        )

    async def prefetch(self, image: ImageInput, call: MediaCall) -> ImageReport:
        _, report = await self._image(image, call)
        return report

    async def _image(self, image: ImageInput, call: MediaCall) -> tuple[Any, ImageReport]:
        """One image through its stages: (what the engine takes, where it came from)."""
        if image.url:
            fetcher = self.context.fetcher
            fetched = await fetcher.fetch(image.index, image.url, call)
            try:
                return await self._image(
                    ImageInput(image.index, fetched.data, mime_type=image.mime_type), call
                )
            except InvalidRequest:
                # bytes that are no image are not kept for the URL either
                await fetcher.forget(image.url, call.tenant)
                raise
        data = image.data
        if data is None:
            source = image
        else:
            digest = (
                await self.context.threads.run("hash", digest_of, data)
                if len(data) > _HASH_IN_THREAD_BYTES
                else digest_of(data)
            )
            source = ImageInput(image.index, data, digest, image.mime_type)
        try:
            lookup = await self._lookup(source, call)
        except ImageNotHeld:
            if data is None:
                self.stats.not_held += 1
                raise
            # a reference-only request started the flight this one joined: try with the bytes
            lookup = await self._lookup(source, call)
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

    async def _lookup(self, source: ImageInput, call: MediaCall) -> Lookup[Any]:
        return await self._decoded(source, call)

    async def _decoded(self, source: ImageInput, call: MediaCall) -> Lookup[DecodedImage]:
        context = self.context
        settings = context.settings

        async def load() -> DecodedImage:
            if source.data is None:
                raise ImageNotHeld(source.digest, source.index)
            await context.chaos.inject("decode", call.tenant)
            started = time.perf_counter()
            try:
                with span("media.decode", {"mmgate.image.bytes": len(source.data)}):
                    image = await context.threads.run(
                        "decode",
                        functools.partial(
                            _decode,
                            max_pixels=settings.max_image_pixels,
                            min_side=settings.min_image_side,
                            shrink=context.shrink,
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

        return await context.cache.get(
            _image_key(context.model_name, source.digest),
            load,
            tenant=call.tenant,
            timeout=call.left(),
            tier=Stage.IMAGE.tier_use,
            label=source.digest,
        )


@final
class EmbeddingsStage(PixelsStage):
    """Encoder outputs are cached too: mmgate runs the vision encoder, the engine takes them."""

    mode = "embeddings"
    description = "mmgate runs the vision encoder and caches its output"
    form: ClassVar[MediaForm] = "embeddings"

    def __init__(self, context: MediaContext, videos: Videos | None = None) -> None:
        super().__init__(context, videos)
        if context.encoder is None:
            raise ValueError("the embeddings stage runs the plan's vision encoder: it has none")
        self.encoder = context.encoder
        settings = context.settings
        self.batcher = EncodeBatcher(
            self.encoder.encode,
            context.threads,
            max_batch=settings.encode_batch,
            window_seconds=settings.encode_window_ms / 1000,
            stats=self.stats,
        )

    @property
    def placeholder_tokens(self) -> int:
        return self.encoder.image_tokens

    def embedding_key(self, digest: str) -> str:
        # the model's name stands for its tower, feature layer and projector; dtype is ours
        settings = {"dtype": str(self.encoder.dtype), "tokens": self.encoder.image_tokens}
        return cache_key(self.context.model_name, Stage.EMBEDDING, {"digest": digest, **settings})

    def stage_keys(self, digest: str) -> dict[Stage, str]:
        return {**super().stage_keys(digest), Stage.EMBEDDING: self.embedding_key(digest)}

    def _engine_item(self, value: Any) -> Any:
        assert isinstance(value, Embedding)
        return value.tensor

    async def _lookup(self, source: ImageInput, call: MediaCall) -> Lookup[Any]:
        encoder = self.encoder

        async def encode() -> Embedding:
            decoded = (await self._decoded(source, call)).value
            await self.context.chaos.inject("encode", call.tenant)
            started = time.perf_counter()
            with span("media.encode", {"mmgate.image.tokens": encoder.image_tokens}) as traced:
                tensor, batch = await self.batcher.encode(decoded.image)
                if traced is not None:
                    traced.set_attribute("mmgate.encode.batch", batch)
            self.stats.encodes += 1
            self.stats.encode_seconds += time.perf_counter() - started
            return Embedding(tensor)

        return await self.context.cache.get(
            self.embedding_key(source.digest),
            encode,
            tenant=call.tenant,
            timeout=call.left(),
            tier=Stage.EMBEDDING.tier_use,
            label=source.digest,
        )


def media_stage(context: MediaContext, *, takes_images: bool, takes_video: bool) -> MediaStage:
    """The variant for a started engine, its videos' beside it: chosen once, never tested for
    again."""
    videos = video_stage(context, takes_video=takes_images and takes_video)
    if not takes_images:
        return NoImages(context.model_name, videos)
    if context.encoder is not None:
        return EmbeddingsStage(context, videos)
    return PixelsStage(context, videos)


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
