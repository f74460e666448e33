"""Clips in embeddings mode end to end: an mmgate server in this process on the tiny video model
with MMGATE_MEDIA__VIDEO_MODE=embeddings (mmgate runs the Qwen2-VL tower on a clip's frames and
caches its output), a real redis-server, the real vLLM engine taking the embeddings."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

from services.api.server import MmgateServer
from services.client import MmgateClient, build_request, digest_of
from services.config import Settings
from services.media_types import VideoSampling
from services.models.tiny_video import engine_settings
from services.pipeline.media.videos import VideoEmbeddingsStage
from services.proto.mmgate.v1 import inference_pb2 as pb
from tests.redis_support import RedisProcess, redis_server
from tests.services.imagegen import png
from tests.services.pipeline.vllm_video import vllm_answer
from tests.support import eventually
from tests.video_clips import moving_shapes

pytestmark = pytest.mark.asyncio(loop_scope="session")

FRAMES = 8


def ask(data: bytes, frames: int = FRAMES) -> pb.GenerateRequest:
    video = pb.Video(data=data, num_frames=frames)
    return build_request("What happens here?", videos=[video], max_tokens=8, temperature=0.0)


@pytest.fixture(scope="module")
def embeddings_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisProcess]:
    server = redis_server(tmp_path_factory.mktemp("video-embeddings-redis"))
    yield server
    server.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def server(tiny_video: Path, embeddings_redis: RedisProcess) -> AsyncIterator[MmgateServer]:
    settings = Settings(
        port=0,
        engine=engine_settings(tiny_video),
        media={"video_mode": "embeddings"},
        redis={"url": embeddings_redis.url},
        metrics={"enabled": False},
        health={"loop_block_seconds": 3600},
    )
    running = MmgateServer(settings, model=str(tiny_video))
    try:
        await running.start()
        yield running
    finally:
        await running.stop(grace=5)


@pytest_asyncio.fixture(loop_scope="session")
async def client(server: MmgateServer) -> AsyncIterator[MmgateClient]:
    async with MmgateClient(f"127.0.0.1:{server.port}", timeout=60.0) as client:
        yield client


def stage(server: MmgateServer) -> VideoEmbeddingsStage:
    videos = server.pipeline.media.videos
    assert isinstance(videos, VideoEmbeddingsStage)
    return videos


async def test_a_clip_gets_the_answer_vllm_gives_for_its_frames(
    client: MmgateClient, server: MmgateServer
) -> None:
    data = moving_shapes(frames=24, seed=31)
    answer = await client.complete_request(ask(data))
    report = answer.final.cache.videos[0]
    assert (report.form, report.frames, report.outcome) == ("embeddings", FRAMES, "miss")
    assert stage(server).stats.encodes == 1

    # vLLM on the same clip: its loader samples it, its engine encodes the frames
    tokens, prompt_tokens = await vllm_answer(server, data, FRAMES, "What happens here?")
    assert list(answer.token_ids) == tokens
    assert answer.final.usage.prompt_tokens == prompt_tokens


async def test_concurrent_requests_encode_once_and_a_repeat_encodes_nothing(
    client: MmgateClient, server: MmgateServer
) -> None:
    videos = stage(server)
    data = moving_shapes(seed=32)
    decodes, encodes = videos.stats.decodes, videos.stats.encodes
    answers = await asyncio.gather(*(client.complete_request(ask(data)) for _ in range(16)))
    assert (videos.stats.decodes, videos.stats.encodes) == (decodes + 1, encodes + 1)
    # one encoded it; the others joined it, or (arriving after it ended) found it stored
    outcomes = [a.final.cache.videos[0].outcome for a in answers]
    assert outcomes.count("miss") == 1
    assert set(outcomes) <= {"miss", "coalesced", "hit"}
    again = await client.complete_request(ask(data))
    assert again.final.cache.videos[0].outcome == "hit"
    assert (videos.stats.decodes, videos.stats.encodes) == (decodes + 1, encodes + 1)
    assert again.token_ids == answers[0].token_ids


async def test_the_encoder_output_comes_back_from_redis(
    client: MmgateClient, server: MmgateServer
) -> None:
    videos = stage(server)
    data = moving_shapes(seed=33)
    first = await client.complete_request(ask(data))
    key = videos.embedding_key(digest_of(data), videos.sampling(VideoSampling(FRAMES)))
    tier = server.tier
    assert tier is not None

    async def written() -> bool:
        # the write does not delay the answer: Redis holds it a little later
        return await tier.get("default", key, stage="video_embedding", timeout=5) is not None

    await eventually(written, timeout=10)
    # this replica forgets both of the clip's entries: only Redis holds them now
    assert await server.cache.invalidate(key, local=True)
    frames_key = videos.key(digest_of(data), videos.sampling(VideoSampling(FRAMES)))
    await server.cache.invalidate(frames_key, local=True)
    encodes, decodes = videos.stats.encodes, videos.stats.decodes
    second = await client.complete_request(ask(data))
    report = second.final.cache.videos[0]
    assert (report.outcome, report.tier, report.frames) == ("miss", "redis", FRAMES)
    assert (videos.stats.encodes, videos.stats.decodes) == (encodes, decodes)
    assert second.token_ids == first.token_ids


async def test_an_image_in_pixels_and_a_clip_in_embeddings_in_one_chat(
    client: MmgateClient,
) -> None:
    request = build_request(
        "<image> and <video>: the same?",
        images=[png(34)],
        videos=[pb.Video(data=moving_shapes(seed=34), num_frames=4)],
        max_tokens=4,
        temperature=0.0,
    )
    answer = await client.complete_request(request)
    assert answer.final.cache.images[0].form == "pixels"
    assert answer.final.cache.videos[0].form == "embeddings"
    assert len(answer.token_ids) == 4


async def test_auto_leaves_a_fast_tower_to_the_engine_and_says_why(
    tiny_video: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from services.config import MediaSettings
    from services.pipeline.media import plan_media

    with caplog.at_level("INFO", logger="mmgate.media"):
        # in a thread, as the server reads it: the session's loop serves other servers
        plan = await asyncio.to_thread(
            plan_media, MediaSettings(), str(tiny_video), "float32", device_share=1.0
        )
    assert plan.takes_video
    assert plan.clip_encoder is None
    assert "video mode auto chose pixels: the video tower takes" in caplog.text
    # a bound it meets: the tower's output is cached
    eager = MediaSettings(auto_min_encode_ms=0)
    plan = await asyncio.to_thread(plan_media, eager, str(tiny_video), "float32", device_share=1.0)
    assert plan.clip_encoder is not None


async def test_the_model_info_says_clips_are_cached_as_embeddings(client: MmgateClient) -> None:
    info = await client.model_info()
    assert (info.takes_video, info.video_mode) == (True, "embeddings")
