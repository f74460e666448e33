"""The media stage without an engine: decoding limits, validation, and the cache flights
(a real CacheActor; what the engine would take is checked, not run)."""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

import pytest
from PIL import Image

from cache_actor import CacheActor, CacheRecursionError, Stage
from services.api.validation import validate
from services.client import HeldImages, build_request, digest_of
from services.config import Settings
from services.errors import ImageNotHeld, ImageRejected, InvalidRequest
from services.pipeline.cache_front import CacheFront
from services.pipeline.media import ImageFetcher, MediaContext, PixelsStage, decode, sniff
from services.pipeline.prompts import content_parts
from services.pipeline.request import MediaCall
from services.pipeline.threads import ThreadPools
from services.proto.mmgate.v1 import inference_pb2 as pb
from services.types import ImageInput
from tests.support import eventually

from ..imagegen import corrupt_png, encoded, picture, png, png_bomb
from ..reentering import ReEntering

SETTINGS = Settings()
THREADS = ThreadPools(SETTINGS.threads)
LIMITS = {"max_pixels": SETTINGS.media.max_image_pixels, "min_side": 8}


def call(tenant: str = "default") -> MediaCall:
    """The tenant's images, due thirty seconds from now on time.monotonic()'s clock."""
    return MediaCall(tenant, time.monotonic() + 30.0)


def context(cache: CacheFront) -> MediaContext:
    """The tiny model's media state, 16 tokens an image."""
    fetcher = ImageFetcher(SETTINGS.media, cache)
    return MediaContext(SETTINGS.media, cache, "tiny", THREADS, fetcher, placeholder_tokens=16)


# ── decoding ───────────────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize(
    ("fmt", "mime"), [("PNG", "image/png"), ("JPEG", "image/jpeg"), ("WEBP", "image/webp")]
)
def test_each_format_is_sniffed_and_decoded_to_rgb(fmt: str, mime: str) -> None:
    data = encoded(picture(1).convert("RGBA" if fmt == "PNG" else "RGB"), fmt)
    assert sniff(data) == mime
    image = decode(data, "", **LIMITS)
    assert image.mode == "RGB"
    assert image.size == (64, 48)
    assert decode(data, mime, **LIMITS).size == (64, 48)


@pytest.mark.parametrize(
    ("data", "mime", "says"),
    [
        (b"GIF89a" + b"\x00" * 64, "", "not a PNG, JPEG or WebP"),
        (png(2), "image/jpeg", "mime_type says image/jpeg, the bytes are image/png"),
        (corrupt_png(3), "", "corrupt image/png image"),
        (png(4)[:200], "", "corrupt image/png image"),
        (png(5, size=(1, 1)), "", "each side needs 8 or more"),
        (png_bomb(), "", "decompression bomb"),
        (png_bomb(7_000), "", "49000000 pixels"),
    ],
    ids=["gif", "mime-mismatch", "corrupt", "truncated", "one-pixel", "bomb", "too-many-pixels"],
)
def test_hostile_or_bad_images_are_refused_with_a_reason(data: bytes, mime: str, says: str) -> None:
    with pytest.raises(ImageRejected) as caught:
        decode(data, mime, **LIMITS)
    assert says in str(caught.value)
    # mmgate's words: no object of this process named, no address
    assert re.search(r"<\S+ object|at 0x[0-9a-f]+", str(caught.value)) is None


def test_a_bomb_is_refused_with_mmgates_own_limit() -> None:
    # Pillow refuses past twice its threshold, in its own sentence citing that threshold (80 M
    # where the limit is 40 M): the caller reads the size and the configured limit
    previous = Image.MAX_IMAGE_PIXELS
    Image.MAX_IMAGE_PIXELS = 40_000_000
    try:
        with pytest.raises(ImageRejected) as caught:
            decode(png_bomb(), "", max_pixels=40_000_000, min_side=8)
    finally:
        Image.MAX_IMAGE_PIXELS = previous
    assert str(caught.value) == (
        "decompression bomb refused: 1600000000 pixels; the limit is 40000000"
    )


def test_the_bomb_is_refused_before_decoding() -> None:
    # 40,000 x 40,000 grey: decoding would need 1.6 GB; refusing takes the header only
    data = png_bomb()
    assert len(data) < 64 * 1024
    with pytest.raises(ImageRejected):
        decode(data, "", max_pixels=10_000_000, min_side=1)


# ── validation ─────────────────────────────────────────────────────────────────────────────


def violated(request: pb.GenerateRequest, settings: Settings = SETTINGS) -> set[str]:
    with pytest.raises(InvalidRequest) as caught:
        validate(request, settings, max_model_len=1024, takes_images=True)
    return {v.field for v in caught.value.violations}


def test_placeholders_must_match_the_images() -> None:
    two = [pb.Image(data=png(1)), pb.Image(data=png(2))]
    assert violated(pb.GenerateRequest(prompt="<image> what?", images=two)) == {"prompt"}
    chat = pb.Chat(messages=[pb.ChatMessage(role="user", content="<image><image><image>?")])
    assert violated(pb.GenerateRequest(chat=chat, images=two)) == {"chat.messages"}
    fine = pb.GenerateRequest(prompt="<image> and <image>?", images=two)
    assert len(validate(fine, SETTINGS, max_model_len=1024, takes_images=True).images) == 2


def test_too_many_images() -> None:
    request = pb.GenerateRequest(prompt="<image>" * 100, images=[pb.Image(data=png(1))] * 100)
    assert violated(request) == {"images"}


def test_each_bad_image_is_named() -> None:
    request = pb.GenerateRequest(
        prompt="<image>" * 5,
        images=[
            pb.Image(data=png(1)),
            pb.Image(),
            pb.Image(digest="md5:abc"),
            pb.Image(data=png(2), mime_type="image/gif"),
            pb.Image(data=b"x" * (SETTINGS.media.max_image_bytes + 1)),
        ],
    )
    assert violated(request) == {
        "images[1]",
        "images[2].digest",
        "images[3].mime_type",
        "images[4].data",
    }


def test_a_text_model_does_not_count_placeholders() -> None:
    request = pb.GenerateRequest(prompt="What does <image> mean in HTML?")
    assert validate(request, SETTINGS, max_model_len=1024).images == ()


def test_chat_content_becomes_parts_around_images() -> None:
    assert content_parts("<image>What is this?") == [
        {"type": "image"},
        {"type": "text", "text": "What is this?"},
    ]
    assert content_parts("A <image> and <image>") == [
        {"type": "text", "text": "A "},
        {"type": "image"},
        {"type": "text", "text": " and "},
        {"type": "image"},
    ]


# ── the client's references ────────────────────────────────────────────────────────────────


def test_the_client_places_images_and_sends_held_ones_by_digest() -> None:
    data = png(9)
    request = build_request("What is it?", images=[data])
    assert request.chat.messages[0].content == "<image>\nWhat is it?"
    held = HeldImages(capacity=2)
    assert held.by_reference(request) is None
    held.add(digest_of(data))
    slim = held.by_reference(request)
    assert slim is not None
    assert slim.images[0].WhichOneof("source") == "digest"
    assert slim.images[0].digest == digest_of(data)
    assert request.images[0].data == data  # the original keeps its bytes for a resend
    held.forget(slim)
    assert held.by_reference(request) is None
    for seed in range(3):
        held.add(digest_of(png(seed)))
    assert digest_of(png(0)) not in held  # bounded: the oldest went first


# ── the pipeline's flights ─────────────────────────────────────────────────────────────────


def data(data: bytes, index: int = 0) -> ImageInput:
    return ImageInput(index, data)


def ref(digest: str, index: int = 0) -> ImageInput:
    return ImageInput(index, None, digest)


@pytest.fixture
async def pipeline() -> Any:
    async with CacheActor() as actor:
        cache = CacheFront(lambda: actor)
        yield PixelsStage(context(cache))


async def test_concurrent_requests_decode_once_then_hit(pipeline: PixelsStage) -> None:
    image = data(png(11))
    first, second = await asyncio.gather(
        pipeline.prepare([image], call()),
        pipeline.prepare([image], call()),
    )
    assert pipeline.stats.decodes == 1
    assert sorted(r.outcome for r in (*first.reports, *second.reports)) == ["coalesced", "miss"]
    assert first.engine.items[0] is second.engine.items[0]
    assert first.engine.uuids == (digest_of(png(11)),)
    assert first.engine.form == "pixels"
    third = await pipeline.prepare([ref(digest_of(png(11)))], call())
    assert third.reports[0].outcome == "hit"
    assert third.reports[0].tier == "memory"
    assert pipeline.stats.decodes == 1


async def test_a_reference_is_per_tenant_and_not_found_elsewhere(pipeline: PixelsStage) -> None:
    bytes_ = png(12)
    await pipeline.prepare([data(bytes_)], call("a"))
    with pytest.raises(ImageNotHeld) as caught:
        await pipeline.prepare([data(png(1)), ref(digest_of(bytes_), 1)], call("b"))
    assert caught.value.index == 1
    assert pipeline.stats.not_held == 1
    # nothing was stored for the failed reference: the bytes still work for tenant b
    again = await pipeline.prepare([data(bytes_)], call("b"))
    assert again.reports[0].outcome == "miss"


async def test_bytes_that_joined_a_failing_reference_try_again(pipeline: PixelsStage) -> None:
    bytes_ = png(13)
    digest = digest_of(bytes_)
    reference, with_bytes = await asyncio.gather(
        pipeline.prepare([ref(digest)], call()),
        pipeline.prepare([data(bytes_)], call()),
        return_exceptions=True,
    )
    assert isinstance(reference, ImageNotHeld)
    assert not isinstance(with_bytes, BaseException)
    assert pipeline.stats.decodes == 1


async def test_a_corrupt_image_is_invalid_and_not_cached(pipeline: PixelsStage) -> None:
    with pytest.raises(InvalidRequest) as caught:
        await pipeline.prepare([data(png(1)), data(corrupt_png(2), 1)], call())
    assert [v.field for v in caught.value.violations] == ["images[1]"]
    assert pipeline.stats.rejected == 1
    # the failure is not stored (the good image's decode, if it was still queued for a thread
    # when the request failed, was cancelled with it; one that had started is stored)
    corrupt = pipeline.stage_keys(digest_of(corrupt_png(2)))[Stage.IMAGE]

    async def settled() -> bool:
        return pipeline.context.cache.stats().flights == 0

    await eventually(settled, timeout=10)
    assert (await pipeline.context.cache.inspect(corrupt)).state == "absent"
    assert pipeline.context.cache.stats().entries <= 1
    # and the corrupt image is refused again, not served from anywhere
    with pytest.raises(InvalidRequest):
        await pipeline.prepare([data(corrupt_png(2))], call())


async def test_a_miss_path_that_looks_the_image_up_again_fails_fast() -> None:
    """The ghost-key failure: a miss path that re-enters the cache for its own key."""
    async with CacheActor() as actor:
        cache = CacheFront(lambda: actor)
        stage_ = ReEntering(context(cache))
        bytes_ = png(14)
        with pytest.raises(CacheRecursionError):
            await asyncio.wait_for(stage_.prepare([data(bytes_)], call()), 10)
        ok = await PixelsStage(context(cache)).prepare([data(bytes_)], call())
        assert ok.reports[0].outcome == "miss"  # nothing poisoned the key
        assert cache.stats().recursion_rejections == 1
