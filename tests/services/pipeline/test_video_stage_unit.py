"""The video stage without an engine: a real CacheActor and thread pools, the real codec on
clips made here, and the frames' form in the second tier. One test holds the decode (a decode
that waits for its stop flag, as the real one checks it between frames) to show that a caller who
leaves stops the thread."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator

import numpy as np
import pytest
import torch
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from cache_actor import CacheActor
from services.config import Settings
from services.engine.values import BadValue, seal_tensor
from services.engine.video_encoder import ClipEmbedding
from services.errors import DecodeStopped, InvalidRequest, ModelTakesNoVideo, VideoNotHeld
from services.media_types import VideoInput, VideoSampling
from services.observability import spans
from services.pipeline.cache_front import CacheFront
from services.pipeline.media import ImageFetcher, MediaContext
from services.pipeline.media import videos as video_stage_module
from services.pipeline.media.videos import ClipFrames, NoVideos, VideoStage
from services.pipeline.request import MediaCall
from services.pipeline.threads import ThreadPools
from services.pipeline.tier_values import ClipEmbeddingCodec, VideoCodec
from services.wire import digest_of
from tests.support import eventually
from tests.video_clips import moving_shapes, not_a_video

SETTINGS = Settings()
THREADS = ThreadPools(SETTINGS.threads)


def call(tenant: str = "default", seconds: float = 30.0) -> MediaCall:
    return MediaCall(tenant, time.monotonic() + seconds)


def clip(data: bytes | None, frames: int = 4, digest: str = "") -> VideoInput:
    return VideoInput(0, data, VideoSampling(frames), digest=digest)


@pytest.fixture
async def stage() -> AsyncIterator[VideoStage]:
    async with CacheActor() as actor:
        cache = CacheFront(lambda: actor)
        fetcher = ImageFetcher(SETTINGS.media, cache)
        context = MediaContext(SETTINGS.media, cache, "tiny", THREADS, fetcher, 1)
        yield VideoStage(context)


async def test_one_decode_for_two_requests_then_a_hit(stage: VideoStage) -> None:
    data = moving_shapes(seed=21)
    first, second = await asyncio.gather(
        stage.prepare([clip(data)], call()), stage.prepare([clip(data)], call())
    )
    assert stage.stats.decodes == 1
    assert stage.stats.frames == 4
    assert sorted(r.outcome for r in (*first.reports, *second.reports)) == ["coalesced", "miss"]
    assert first.engine.items[0] is second.engine.items[0]
    assert first.engine.items[0].shape == (4, 64, 64, 3)
    # the identity vLLM's caches key on names the frames asked for, not the clip alone
    assert first.engine.uuids == (f"{digest_of(data)}:4f:0fps",)
    third = await stage.prepare([clip(None, digest=digest_of(data))], call())
    assert third.reports[0].outcome == "hit"
    assert stage.stats.decodes == 1


async def test_frames_beyond_the_servers_are_the_servers(stage: VideoStage) -> None:
    assert stage.sampling(VideoSampling(0)) == VideoSampling(SETTINGS.media.max_video_frames)
    assert stage.sampling(VideoSampling(10_000, 2.0)) == VideoSampling(
        SETTINGS.media.max_video_frames, 2.0
    )


async def test_a_reference_only_request_is_not_held_and_stores_nothing(
    stage: VideoStage,
) -> None:
    digest = digest_of(b"never sent")
    with pytest.raises(VideoNotHeld) as caught:
        await stage.prepare([clip(None, digest=digest)], call())
    assert "videos[0]" in str(caught.value)
    assert stage.stats.not_held == 1
    key = stage.key(digest, stage.sampling(VideoSampling(4)))
    assert (await stage.context.cache.inspect(key)).state == "absent"


async def test_a_refused_clip_names_its_index_and_is_not_stored(stage: VideoStage) -> None:
    with pytest.raises(InvalidRequest) as caught:
        await stage.prepare([clip(not_a_video())], call())
    [violation] = caught.value.violations
    assert violation.field == "videos[0]"
    assert "not an MP4, WebM or AVI video" in violation.description
    assert stage.stats.rejected == 1
    key = stage.key(digest_of(not_a_video()), stage.sampling(VideoSampling(4)))
    assert (await stage.context.cache.inspect(key)).state == "absent"


@pytest.mark.parametrize("leaves", ["cancelled", "deadline"])
async def test_a_decode_nobody_waits_for_stops(
    stage: VideoStage, monkeypatch: pytest.MonkeyPatch, leaves: str
) -> None:
    started, stopped = threading.Event(), threading.Event()

    def held(data: bytes, mime: str, *, stop: threading.Event, **_: object) -> object:
        started.set()
        if stop.wait(timeout=30):
            stopped.set()
            raise DecodeStopped("stopped")
        raise AssertionError("the decode was left running for nobody")

    monkeypatch.setattr(video_stage_module, "decode_video", held)
    data = moving_shapes(seed=22)
    waiting = asyncio.ensure_future(
        stage.prepare([clip(data)], call(seconds=0.2 if leaves == "deadline" else 30))
    )
    assert await asyncio.to_thread(started.wait, 30)
    if leaves == "cancelled":
        waiting.cancel()
    with pytest.raises((asyncio.CancelledError, TimeoutError)):
        await waiting
    # the flight had no waiter left: cancelled, its thread told to stop, nothing stored
    assert await asyncio.to_thread(stopped.wait, 30)

    async def counted() -> bool:
        return stage.stats.stopped == 1

    await eventually(counted, timeout=30)
    assert stage.stats.decodes == 0
    key = stage.key(digest_of(data), stage.sampling(VideoSampling(4)))
    assert (await stage.context.cache.inspect(key)).state == "absent"
    assert next(s for s in THREADS.stats() if s.pool == "decode").busy == 0


async def test_a_model_without_video_refuses_before_any_work() -> None:
    with pytest.raises(ModelTakesNoVideo, match="model tiny takes no video"):
        await NoVideos("tiny").prepare([clip(b"x")], call())


def test_frames_go_to_the_second_tier_and_back_as_they_were() -> None:
    codec = VideoCodec()
    frames = np.arange(2 * 4 * 6 * 3, dtype=np.uint8).reshape(2, 4, 6, 3)
    back = codec.decode(codec.encode(ClipFrames(frames), "k"), "k")
    assert back.frames.dtype == np.uint8
    assert np.array_equal(back.frames, frames)
    # a tensor that is not frames, under the right key and stage, is still refused
    not_frames = seal_tensor("video", torch.ones(2, 3), key="k")
    with pytest.raises(BadValue, match="not a clip's frames"):
        codec.decode(not_frames, "k")
    with pytest.raises(BadValue):
        codec.decode(codec.encode(ClipFrames(frames), "k"), "another key")


def test_a_clips_embeddings_go_to_the_second_tier_with_their_grid() -> None:
    codec = ClipEmbeddingCodec()
    clip = ClipEmbedding(torch.randn(16, 8), (4, 4, 4), 8)
    back = codec.decode(codec.encode(clip, "k"), "k")
    assert torch.equal(back.embeds, clip.embeds)
    assert (back.grid, back.frames) == ((4, 4, 4), 8)
    # rows that no merge of the grid's patches makes are refused
    odd = ClipEmbedding(torch.randn(5, 8), (4, 4, 4), 8)
    with pytest.raises(BadValue, match="for a grid of"):
        codec.decode(codec.encode(odd, "k"), "k")
    # a plain tensor under the stage's name has no grid
    with pytest.raises(BadValue, match="grid"):
        codec.decode(seal_tensor("video_embedding", torch.ones(2, 3), key="k"), "k")


async def test_a_decode_is_one_span_with_the_clips_frames_and_size(stage: VideoStage) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    token = spans.CURRENT_TRACER.set(provider.get_tracer("test"))
    try:
        await stage.prepare([clip(moving_shapes(seed=23), frames=4)], call())
    finally:
        spans.CURRENT_TRACER.reset(token)
    spans.flush_pending()
    [decode] = [s for s in exporter.get_finished_spans() if s.name == "media.decode"]
    attributes = dict(decode.attributes or {})
    assert attributes["mmgate.media.kind"] == "video"
    assert attributes["mmgate.video.frames"] == 4
    assert attributes["mmgate.video.source_frames"] == 16
    assert (attributes["mmgate.video.width"], attributes["mmgate.video.height"]) == (64, 64)
    assert attributes["mmgate.video.bytes"] == len(moving_shapes(seed=23))
