"""A request's videos, and any media URL, checked against the contract and the server's limits
before anything is fetched or decoded (images: validation.py).

    pb.Video ─▶ count within max_videos_per_request, one "<video>" placeholder each, in order
             ─▶ one source: bytes (not empty, within max_video_bytes), a digest, or a URL
             ─▶ mime type one of VIDEO_MIME_TYPES (or empty: sniffed)
             ─▶ num_frames within max_video_frames, fps finite and not negative
             ─▶ VideoInput
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Final

from google.protobuf import unknown_fields

from ..config import MediaSettings
from ..errors import Violation
from ..media_types import VideoInput, VideoSampling
from ..pipeline.media.fetch import url_problem
from ..proto.mmgate.v1 import inference_pb2 as pb
from ..wire import VIDEO_MIME_TYPES, VIDEO_PLACEHOLDER, is_digest

MAX_URL_CHARS: Final = 2048  # a media URL's length, as browsers and CDNs keep to


def url_violations(url: str, field: str) -> list[Violation]:
    """What is wrong with a media URL as sent (before the guard sees where it leads)."""
    if not url or len(url) > MAX_URL_CHARS or not url.isprintable() or " " in url:
        return [
            Violation(
                field, f"an absolute URL of 1 to {MAX_URL_CHARS} printable characters, no spaces"
            )
        ]
    if (problem := url_problem(url)) is not None:
        return [Violation(field, problem)]
    return []


def checked_videos(
    videos: Sequence[pb.Video],
    contents: Sequence[str],
    limits: MediaSettings,
    bad: Callable[[str, str], None],
) -> tuple[VideoInput, ...]:
    """A chat's videos as the pipeline takes them; each problem told to ``bad``."""
    if len(videos) > limits.max_videos_per_request:
        bad("videos", f"{len(videos)} videos; the limit is {limits.max_videos_per_request}")
        return ()
    placeholders = sum(content.count(VIDEO_PLACEHOLDER) for content in contents)
    if placeholders != len(videos):
        bad(
            "chat.messages",
            f"{placeholders} {VIDEO_PLACEHOLDER} placeholders for {len(videos)} videos;"
            " each video needs one, in order",
        )
    for i, video in enumerate(videos):
        _check(video, f"videos[{i}]", limits, bad)
    return tuple(_video_input(i, video) for i, video in enumerate(videos))


def media_source(
    item: pb.Image | pb.Video, where: str, bad: Callable[[str, str], None]
) -> str | None:
    """An image's or a clip's ``source`` (data, digest or url; None: unset), what is wrong with
    its fields and its digest told to ``bad``."""
    if len(unknown_fields.UnknownFieldSet(item)) > 0:
        bad(where, "carries fields this server does not know")
    source: str | None = item.WhichOneof("source")
    if source is None:
        bad(where, "set data, digest or url")
    elif source == "digest" and not is_digest(item.digest):
        bad(f"{where}.digest", "'sha256:' and 64 lowercase hex digits")
    return source


def _check(
    video: pb.Video, where: str, limits: MediaSettings, bad: Callable[[str, str], None]
) -> None:
    source = media_source(video, where, bad)
    if source == "data":
        if not video.data:
            bad(f"{where}.data", "must not be empty")
        elif len(video.data) > limits.max_video_bytes:
            bad(f"{where}.data", f"{len(video.data)} bytes; the limit is {limits.max_video_bytes}")
    elif source == "url":
        for violation in url_violations(video.url, f"{where}.url"):
            bad(violation.field, violation.description)
    if video.mime_type and video.mime_type not in VIDEO_MIME_TYPES:
        allowed = ", ".join(VIDEO_MIME_TYPES)
        bad(f"{where}.mime_type", f"{video.mime_type!r} is not one of {allowed}")
    if video.num_frames > limits.max_video_frames:
        bad(
            f"{where}.num_frames",
            f"{video.num_frames} frames; the limit is {limits.max_video_frames}",
        )
    if not math.isfinite(video.fps) or video.fps < 0:
        bad(f"{where}.fps", "a frame rate of 0 (no bound) or more")


def _video_input(index: int, video: pb.Video) -> VideoInput:
    # refused already where not finite or negative (_check): never raised here
    fps = video.fps if math.isfinite(video.fps) and video.fps > 0 else 0.0
    sampling = VideoSampling(video.num_frames, fps)
    source = video.WhichOneof("source")
    if source == "data":
        return VideoInput(index, video.data, sampling, mime_type=video.mime_type)
    if source == "url":
        return VideoInput(index, None, sampling, url=video.url, mime_type=video.mime_type)
    return VideoInput(index, None, sampling, digest=video.digest, mime_type=video.mime_type)


__all__ = ["MAX_URL_CHARS", "checked_videos", "media_source", "url_violations"]
