"""The video codec on real clips made here (tests/video_clips.py): sniffing, the frames it hands
on, vLLM's sampling rule and vLLM's own decode of the same bytes, and each hostile clip refused
in mmgate's words within its bound."""

from __future__ import annotations

import itertools
import re
import threading
import time
from collections.abc import Callable

import numpy as np
import pytest

from services.errors import DecodeStopped, VideoRejected
from services.media_types import VideoSampling
from services.pipeline.media.video import (
    VideoLimits,
    decode_video,
    sample_indices,
    sniff_video,
)
from services.wire import VIDEO_MIME_TYPES
from tests.video_clips import (
    fake_magic,
    huge_frames,
    million_frames,
    moving_shapes,
    not_a_video,
    slow_clip,
    solid,
    truncated,
    zero_length,
)

LIMITS = VideoLimits(
    max_frame_pixels=1920 * 1080, max_seconds=60.0, max_frames=32, decode_seconds=5
)
CONTAINERS = dict(zip(("mp4", "webm", "avi"), VIDEO_MIME_TYPES, strict=True))
# what a refusal must never show: an object's address, a class or module name, a source path
LEAKS = re.compile(r"\b0x[0-9a-f]{4,}|<|>|Error|Exception|cv2|opencv|\.(py|cpp|hpp)\b", re.I)


# ── sniffing ───────────────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize(("container", "mime"), CONTAINERS.items())
def test_each_container_is_sniffed(container: str, mime: str) -> None:
    assert sniff_video(moving_shapes(container=container)) == mime


@pytest.mark.parametrize(
    "data",
    [not_a_video(), b"", b"RIFF", b"RIFF\x00\x00\x00\x00WEBPVP8 ", b"#EXTM3U\n", b"ffconcat"],
    ids=["png", "empty", "short", "webp", "hls", "concat"],
)
def test_other_bytes_are_not_sniffed_as_video(data: bytes) -> None:
    assert sniff_video(data) is None


# ── frames ─────────────────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize(("container", "mime"), CONTAINERS.items())
def test_each_container_decodes_to_rgb_frames(container: str, mime: str) -> None:
    data = moving_shapes(frames=16, size=(64, 48), fps=8.0, container=container)
    video = decode_video(data, mime, VideoSampling(num_frames=4), LIMITS)
    assert video.frames.shape == (4, 48, 64, 3)
    assert video.frames.dtype == np.uint8
    assert video.frames.flags.c_contiguous
    assert video.indices == (0, 5, 10, 15)
    assert (video.source_frames, video.source_fps, video.duration) == (16, 8.0, 2.0)
    assert video.nbytes == 4 * 48 * 64 * 3
    # the shapes move: no two sampled frames alike
    assert all(
        not np.array_equal(video.frames[a], video.frames[b])
        for a, b in itertools.combinations(range(4), 2)
    )


@pytest.mark.parametrize("container", CONTAINERS)
def test_a_red_clip_decodes_to_red_in_rgb(container: str) -> None:
    frames = decode_video(solid((255, 0, 0), container=container), "", VideoSampling(), LIMITS)
    pixels = frames.frames.reshape(-1, 3)
    assert pixels[:, 0].min() >= 240
    assert pixels[:, 1:].max() <= 10


def test_distinct_seeds_give_distinct_clips() -> None:
    assert moving_shapes(seed=0) != moving_shapes(seed=1)
    zero = decode_video(moving_shapes(seed=0), "", VideoSampling(), LIMITS).frames
    one = decode_video(moving_shapes(seed=1), "", VideoSampling(), LIMITS).frames
    assert not np.array_equal(zero, one)


# ── sampling ───────────────────────────────────────────────────────────────────────────────


def test_sample_indices_follow_vllms_rule() -> None:
    from vllm.multimodal.video import VideoBackend
    from vllm.multimodal.video_decoders import VideoSourceMetadata, VideoTargetMetadata

    grid = itertools.product(
        (1, 2, 3, 7, 16, 100, 1001),  # total frames
        (0.1, 1.0, 2.0, 33.3),  # duration
        (0, 1, 2, 5, 16, 64, 5000),  # num_frames
        (0.0, 0.5, 1.0, 2.0, 7.5),  # fps
        (8, 32, 4096),  # max_frames
    )
    for total, duration, num_frames, fps, max_frames in grid:
        ours = sample_indices(total, duration, VideoSampling(num_frames, fps), max_frames)
        # vLLM's num_frames <= 0 is "all"; mmgate's 0 is "max_frames", and max_frames caps it
        asked = min(num_frames, max_frames) if num_frames else max_frames
        theirs = VideoBackend.compute_frames_index_to_sample(
            source=VideoSourceMetadata(total, total / duration, duration),
            target=VideoTargetMetadata(asked, fps if fps else -1, 300),
        )
        assert ours == theirs, (total, duration, num_frames, fps, max_frames)
        assert len(ours) <= max_frames
        assert ours == sorted(set(ours))


@pytest.mark.parametrize("container", CONTAINERS)
@pytest.mark.parametrize(("num_frames", "fps"), [(1, 0.0), (4, 0.0), (24, 0.0), (8, 2.0)])
def test_frames_equal_vllms_own_decode(container: str, num_frames: int, fps: float) -> None:
    from vllm.multimodal.video import VideoBackend

    data = moving_shapes(frames=24, size=(48, 32), seed=3, container=container)
    theirs, metadata = VideoBackend.load_bytes(data, num_frames=num_frames, fps=fps or -1)
    ours = decode_video(data, "", VideoSampling(num_frames, fps), LIMITS)
    assert list(ours.indices) == metadata["frames_indices"]
    assert (ours.source_frames, ours.source_fps) == (metadata["total_num_frames"], metadata["fps"])
    np.testing.assert_array_equal(ours.frames, theirs)


def test_sampling_is_capped_at_max_frames() -> None:
    limits = VideoLimits(1920 * 1080, 60.0, max_frames=4, decode_seconds=5)
    for asked in (0, 4, 16):
        video = decode_video(moving_shapes(), "", VideoSampling(num_frames=asked), limits)
        assert video.indices == (0, 5, 10, 15)


def test_fps_bounds_the_frames_per_second_of_clip() -> None:
    # 16 frames at 8 fps: 2 s, so 1.5 frames a second gives 3
    video = decode_video(moving_shapes(), "", VideoSampling(fps=1.5), LIMITS)
    assert video.indices == (0, 7, 15)


# ── refusals ───────────────────────────────────────────────────────────────────────────────


HOSTILE: dict[str, tuple[Callable[[], bytes], str]] = {
    "not a video": (not_a_video, r"^not an MP4, WebM or AVI video$"),
    "fake ftyp": (fake_magic, r"^corrupt MP4 video: it cannot be opened$"),
    "zero length": (zero_length, r"^AVI video with no frames: its header counts none$"),
    "million frames": (
        million_frames,
        r"^125000\.0 s of video \(1000000 frames at 8 fps\); the limit is 60 s$",
    ),
    "huge frames": (
        huge_frames,
        r"^16000x16000 = 256000000 pixels a frame; the limit is 2073600$",
    ),
    # beyond FFmpeg's own limit (~2^28 pixels) it reports no size at all
    "huger frames": (
        lambda: huge_frames(20_000, 20_000),
        r"^corrupt AVI video: its header gives no frame size$",
    ),
    "truncated avi": (
        lambda: truncated(moving_shapes()),
        r"^truncated AVI video: frame 9 cannot be read; "
        r"only 9 of the 16 frames its header declares could be read$",
    ),
    "truncated webm": (
        lambda: truncated(moving_shapes(container="webm")),
        r"^truncated WebM video: frame \d+ cannot be read; "
        r"only \d+ of the 16 frames its header declares could be read$",
    ),
    # OpenCV's writer puts the index (moov) last: without it, nothing opens
    "truncated mp4": (
        lambda: truncated(moving_shapes(container="mp4")),
        r"^corrupt MP4 video: it cannot be opened$",
    ),
}


@pytest.mark.parametrize("name", HOSTILE)
def test_each_hostile_clip_is_refused_quietly_in_mmgates_words(
    name: str, capfd: pytest.CaptureFixture[str]
) -> None:
    make, message = HOSTILE[name]
    data = make()
    capfd.readouterr()  # the writer's own noise, while the clip was made
    started = time.monotonic()
    with pytest.raises(VideoRejected, match=message) as refused:
        decode_video(data, "", VideoSampling(), LIMITS)
    assert time.monotonic() - started < 1.0
    assert not LEAKS.search(str(refused.value))
    # nothing from FFmpeg or OpenCV on stderr (or stdout): a client cannot write to the log
    assert capfd.readouterr() == ("", "")


def test_a_slow_decode_stops_at_decode_seconds() -> None:
    data = slow_clip()  # ~0.05-0.1 s to decode in full
    limits = VideoLimits(1920 * 1080, 60.0, 32, decode_seconds=0.01)
    started = time.monotonic()
    with pytest.raises(VideoRejected, match=r"^decoding took longer than 0\.01 s, the limit \("):
        decode_video(data, "", VideoSampling(), limits)
    assert time.monotonic() - started < 0.5
    assert len(decode_video(data, "", VideoSampling(), LIMITS).indices) == 32


def test_a_frame_over_the_pixel_limit_is_refused_from_the_header() -> None:
    data = moving_shapes(size=(64, 48))
    limits = VideoLimits(64 * 48 - 1, 60.0, 32, 5)
    with pytest.raises(VideoRejected, match=r"^64x48 = 3072 pixels a frame; the limit is 3071$"):
        decode_video(data, "", VideoSampling(), limits)
    assert decode_video(data, "", VideoSampling(), VideoLimits(64 * 48, 60.0, 32, 5)).indices


def test_a_clip_longer_than_max_seconds_is_refused() -> None:
    data = moving_shapes(frames=16, fps=8.0)  # 2 s
    with pytest.raises(VideoRejected, match=r"^2\.0 s of video \(16 frames at 8 fps\)"):
        decode_video(data, "", VideoSampling(), VideoLimits(1 << 20, 1.9, 32, 5))
    assert decode_video(data, "", VideoSampling(), VideoLimits(1 << 20, 2.0, 32, 5)).indices


def test_a_mime_type_other_than_the_bytes_is_refused() -> None:
    with pytest.raises(VideoRejected, match=r"^mime_type says video/mp4, the bytes are video/x"):
        decode_video(moving_shapes(container="avi"), "video/mp4", VideoSampling(), LIMITS)


class _StopAfter(threading.Event):
    """A stop that reads as set from its ``checks``-th look on: a caller gone mid-decode,
    sequenced without a thread."""

    def __init__(self, checks: int) -> None:
        super().__init__()
        self.checks = checks

    def is_set(self) -> bool:
        self.checks -= 1
        return self.checks < 0


def test_a_stop_set_before_the_decode_stops_it() -> None:
    stop = threading.Event()
    stop.set()
    with pytest.raises(DecodeStopped, match=r"^the decode was stopped at frame 0"):
        decode_video(moving_shapes(), "", VideoSampling(), LIMITS, stop=stop)


def test_a_stop_is_checked_between_frames() -> None:
    # one look before the capture opens, then one before each frame: the seventh is frame 5's
    with pytest.raises(DecodeStopped, match=r"^the decode was stopped at frame 5: "):
        decode_video(moving_shapes(), "", VideoSampling(), LIMITS, stop=_StopAfter(6))
    video = decode_video(moving_shapes(), "", VideoSampling(), LIMITS, stop=_StopAfter(100))
    assert len(video.indices) == 16


def test_limits_and_sampling_refuse_nonsense() -> None:
    with pytest.raises(ValueError, match="positive"):
        VideoLimits(0, 60.0, 32, 5)
    with pytest.raises(ValueError, match="positive"):
        VideoLimits(1 << 20, 60.0, 32, 0)
    with pytest.raises(ValueError, match="negative"):
        VideoSampling(num_frames=-1)
    with pytest.raises(ValueError, match="negative"):
        VideoSampling(fps=float("nan"))
    with pytest.raises(ValueError, match="infinite"):
        VideoSampling(fps=float("inf"))
    with pytest.raises(ValueError, match="positive"):
        VideoLimits(1 << 20, float("nan"), 32, 5)
