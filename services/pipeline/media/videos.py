"""The video stage: a request's clips become the sampled frames the engine takes, each clip one
cache flight per (tenant, digest, sampling).

    VideoInput (bytes | digest | url) ── digest (SHA-256 of the bytes) ─────┐
                                                                           ▼
    "video" flight   sniff, check bytes, frame size and length from the header     (decode pool)
                     before decoding; decode and sample the frames (video.py) and stop between
                     frames once nobody waits; ClipFrames, cached in memory and in the second
                     tier (decoding a clip again costs far more than a round trip); a digest
                     with no bytes can only hit: NOT_FOUND
                                                                           ▼
    "video_embedding" flight  (VideoEmbeddingsStage) the model's video processor and tower,
                     run by mmgate on the cached frames (encode pool): ClipEmbedding, cached
                     in memory and the second tier
                                                                           ▼
    EngineVideos(frames | embeddings, uuids = digest + sampling) ──▶ multi_modal_data["video"]

    NoVideos              the model takes no video: refused (FAILED_PRECONDITION)
    VideoStage            sampled frames cached; the engine encodes them (its encoder cache
                          keys on the uuid, salted per tenant as an image's)
    VideoEmbeddingsStage  the tower's output cached too; the engine takes it as it is

The sampling is part of the key: the same clip asked for at 8 and at 16 frames is two entries,
each decoded once.
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Final, Literal, final

from cache_actor import Lookup, Stage

from ...errors import (
    DecodeStopped,
    ImageFetchFailed,
    InvalidRequest,
    ModelTakesNoVideo,
    UrlNotAllowed,
    VideoNotHeld,
    VideoRejected,
    Violation,
)
from ...keys import cache_key
from ...media_types import EngineVideos, VideoInput, VideoReport, VideoSampling, VideoStats
from ...observability.spans import span
from ...wire import digest_of
from ..cache_front import outcome_of
from ..request import MediaCall
from .context import MediaContext
from .together import all_or_first_failure
from .video import VideoLimits, decode_video

if TYPE_CHECKING:
    from ...engine.video_encoder import ClipEmbedding, ClipEncoder

# hashing a large clip on the loop would stall it: beyond this, hash in a thread
_HASH_IN_THREAD_BYTES: Final = 256 * 1024


@final
@dataclass(frozen=True, slots=True)
class ClipFrames:
    """A clip's sampled frames, as cached: an array of (frames, height, width, 3) RGB bytes."""

    frames: Any

    @property
    def nbytes(self) -> int:
        return int(self.frames.nbytes)

    @property
    def count(self) -> int:
        return int(self.frames.shape[0])


@final
@dataclass(frozen=True, slots=True)
class PreparedVideos:
    engine: EngineVideos
    reports: tuple[VideoReport, ...]


class Videos:
    """What the pipeline asks of videos, whether or not the model takes them."""

    takes_video: ClassVar[bool] = True
    mode: ClassVar[str] = "pixels"  # as ModelInfo.video_mode says it

    def __init__(self) -> None:
        self.stats = VideoStats()

    def refuse(self) -> None:
        """Raise why videos cannot be served here; nothing when they can."""

    async def prepare(self, videos: Sequence[VideoInput], call: MediaCall) -> PreparedVideos:
        """All of a request's videos, concurrently, in the call's tenant's namespace and by its
        deadline; the first failure (by index) is raised."""
        self.refuse()
        raise NotImplementedError


@final
class NoVideos(Videos):
    takes_video = False
    mode = "none"

    def __init__(self, model_name: str) -> None:
        super().__init__()
        self.model_name = model_name

    def refuse(self) -> None:
        raise ModelTakesNoVideo(self.model_name)


class VideoStage(Videos):
    """Sampled frames are cached; the engine runs the vision encoder on them."""

    form: ClassVar[Literal["pixels", "embeddings"]] = "pixels"

    def __init__(self, context: MediaContext) -> None:
        super().__init__()
        self.context = context
        settings = context.settings
        self.limits = VideoLimits(
            max_frame_pixels=settings.max_video_frame_pixels,
            max_seconds=settings.max_video_seconds,
            max_frames=settings.max_video_frames,
            decode_seconds=settings.video_decode_seconds,
        )

    def sampling(self, asked: VideoSampling) -> VideoSampling:
        """The sampling a clip is decoded with: at most the server's frames, 0 meaning those."""
        ceiling = self.limits.max_frames
        frames = min(asked.num_frames, ceiling) if asked.num_frames > 0 else ceiling
        return VideoSampling(frames, max(asked.fps, 0.0))

    def key(self, digest: str, sampling: VideoSampling) -> str:
        return cache_key(
            self.context.model_name,
            Stage.VIDEO,
            {"digest": digest, "frames": sampling.num_frames, "fps": sampling.fps},
        )

    async def prepare(self, videos: Sequence[VideoInput], call: MediaCall) -> PreparedVideos:
        # on a failure the others stop waiting; a decode nobody waits for any more stops too
        results = await all_or_first_failure([self._video(video, call) for video in videos])
        return PreparedVideos(
            engine=EngineVideos(
                items=tuple(item for item, _, _ in results),
                uuids=tuple(uuid for _, _, uuid in results),
                form=self.form,
            ),
            reports=tuple(report for _, report, _ in results),
        )

    async def _video(self, video: VideoInput, call: MediaCall) -> tuple[Any, VideoReport, str]:
        """One clip: (what the engine takes, where it came from, its identity for vLLM's
        caches)."""
        if video.url:
            fetcher = self.context.fetcher
            try:
                fetched = await fetcher.fetch(video.index, video.url, call, fetcher.videos)
            except (UrlNotAllowed, ImageFetchFailed) as failed:
                raise failed.at(video.index, "videos") from None
            try:
                return await self._video(
                    VideoInput(
                        video.index, fetched.data, video.sampling, mime_type=video.mime_type
                    ),
                    call,
                )
            except InvalidRequest:
                # bytes that are no video are not kept for the URL either
                await fetcher.forget(video.url, call.tenant, fetcher.videos)
                raise
        data = video.data
        digest = video.digest
        if data is not None:
            digest = (
                await self.context.threads.run("hash", digest_of, data)
                if len(data) > _HASH_IN_THREAD_BYTES
                else digest_of(data)
            )
        sampling = self.sampling(video.sampling)
        source = VideoInput(video.index, data, sampling, digest, video.mime_type)
        try:
            lookup = await self._lookup(source, call)
        except VideoNotHeld:
            if data is None:
                self.stats.not_held += 1
                raise
            # a reference-only request started the flight this one joined: try with the bytes
            lookup = await self._lookup(source, call)
        item, frames = self._engine_item(lookup.value)
        report = VideoReport(
            digest=digest,
            outcome=outcome_of(lookup)[0],
            tier=lookup.tier or "",
            frames=frames,
            form=self.form,
        )
        uuid = f"{digest}:{sampling.num_frames}f:{sampling.fps:g}fps"
        return item, report, uuid

    async def _lookup(self, source: VideoInput, call: MediaCall) -> Lookup[Any]:
        return await self._frames(source, call)

    def _engine_item(self, value: Any) -> tuple[Any, int]:
        """What the engine takes of a cached value, and the frames it was made of."""
        assert isinstance(value, ClipFrames)
        return value.frames, value.count

    async def _frames(self, source: VideoInput, call: MediaCall) -> Lookup[ClipFrames]:
        context = self.context

        async def load() -> ClipFrames:
            if source.data is None:
                raise VideoNotHeld(source.digest, source.index)
            await context.chaos.inject("decode", call.tenant)
            started = time.perf_counter()
            stop = threading.Event()
            attributes: dict[str, str | int | float | bool] = {
                "mmgate.media.kind": "video",
                "mmgate.video.bytes": len(source.data),
            }
            try:
                with span("media.decode", attributes) as traced:
                    decoded = await context.threads.run_stoppable(
                        "decode",
                        functools.partial(
                            decode_video, sampling=source.sampling, limits=self.limits, stop=stop
                        ),
                        stop,
                        source.data,
                        source.mime_type,
                    )
                    if traced is not None:
                        frames, height, width, _ = decoded.frames.shape
                        traced.set_attribute("mmgate.video.frames", frames)
                        traced.set_attribute("mmgate.video.source_frames", decoded.source_frames)
                        traced.set_attribute("mmgate.video.width", width)
                        traced.set_attribute("mmgate.video.height", height)
            except (asyncio.CancelledError, DecodeStopped):
                self.stats.stopped += 1
                raise
            except VideoRejected as exc:
                self.stats.rejected += 1
                raise InvalidRequest([Violation(f"videos[{source.index}]", str(exc))]) from None
            self.stats.decodes += 1
            self.stats.frames += len(decoded.frames)
            self.stats.decode_seconds += time.perf_counter() - started
            return ClipFrames(decoded.frames)

        return await context.cache.get(
            self.key(source.digest, source.sampling),
            load,
            tenant=call.tenant,
            timeout=call.left(),
            tier=Stage.VIDEO.tier_use,
            label=source.digest,
            # a decode outliving every caller stops (the thread at its next frame)
            cancel_when_orphaned=True,
        )


@final
class VideoEmbeddingsStage(VideoStage):
    """The tower's output for a clip is cached too: mmgate runs it, the engine takes it."""

    form = "embeddings"
    mode = "embeddings"

    def __init__(self, context: MediaContext) -> None:
        super().__init__(context)
        if context.clip_encoder is None:
            raise ValueError("the clips' embeddings stage runs the plan's video tower: it has none")
        self.encoder: ClipEncoder = context.clip_encoder

    def embedding_key(self, digest: str, sampling: VideoSampling) -> str:
        # the model's name stands for its processor and tower; the dtype is mmgate's
        settings = {
            "frames": sampling.num_frames,
            "fps": sampling.fps,
            "dtype": str(self.encoder.dtype),
        }
        return cache_key(
            self.context.model_name, Stage.VIDEO_EMBEDDING, {"digest": digest, **settings}
        )

    def _engine_item(self, value: Any) -> tuple[Any, int]:
        clip: ClipEmbedding = value
        return clip, clip.frames

    async def _lookup(self, source: VideoInput, call: MediaCall) -> Lookup[Any]:
        context = self.context

        async def encode() -> ClipEmbedding:
            frames = (await self._frames(source, call)).value
            await context.chaos.inject("encode", call.tenant)
            started = time.perf_counter()
            attributes: dict[str, str | int | float | bool] = {
                "mmgate.media.kind": "video",
                "mmgate.video.frames": frames.count,
            }
            with span("media.encode", attributes) as traced:
                clip = await context.threads.run("encode", self.encoder.encode, frames.frames)
                if traced is not None:
                    traced.set_attribute("mmgate.video.tokens", int(clip.embeds.shape[0]))
            self.stats.encodes += 1
            self.stats.encode_seconds += time.perf_counter() - started
            return clip

        return await context.cache.get(
            self.embedding_key(source.digest, source.sampling),
            encode,
            tenant=call.tenant,
            timeout=call.left(),
            tier=Stage.VIDEO_EMBEDDING.tier_use,
            label=source.digest,
        )


def video_stage(context: MediaContext, *, takes_video: bool) -> Videos:
    """The variant for a started engine: chosen once, never tested for again."""
    if not takes_video:
        return NoVideos(context.model_name)
    if context.clip_encoder is not None:
        return VideoEmbeddingsStage(context)
    return VideoStage(context)


__all__ = [
    "ClipFrames",
    "NoVideos",
    "PreparedVideos",
    "VideoEmbeddingsStage",
    "VideoStage",
    "Videos",
    "video_stage",
]
