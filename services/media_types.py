"""A request's videos as the layers carry them, from the checked request to the engine and the
reply, and what the media stages count (no proto here: services/api/media_inputs.py makes these
of the request's fields).

    api/media_inputs ─▶ VideoInput (VideoSampling) ─▶ pipeline/media/videos ─▶ EngineVideos
                     ─▶ engine; VideoReport ─▶ the reply
    media stages     ─▶ MediaStats (images), VideoStats ─▶ metrics, GetStats
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal, final


@final
@dataclass(frozen=True, slots=True)
class VideoSampling:
    """Which frames of a clip the model sees, as vLLM samples them: at most ``num_frames`` (0:
    the server's most), spread evenly, and at most ``fps`` for each second of the clip (0: no
    such bound)."""

    num_frames: int = 0
    fps: float = 0.0

    def __post_init__(self) -> None:
        # an infinite or NaN rate would reach math.floor when the frames are chosen
        if self.num_frames < 0 or not (math.isfinite(self.fps) and self.fps >= 0):
            raise ValueError(f"frame sampling must not be negative or infinite: {self}")


@final
@dataclass(frozen=True, slots=True)
class VideoInput:
    """One video of a request: its bytes, or (``data`` None) the digest of bytes sent earlier,
    or the URL mmgate fetches them from; and the frames to sample from it."""

    index: int
    data: bytes | None
    sampling: VideoSampling
    digest: str = ""
    mime_type: str = ""
    url: str = ""


@final
@dataclass(frozen=True, slots=True)
class EngineVideos:
    """A request's videos as the engine takes them: each clip's sampled frames, an array of
    (frames, height, width, 3) RGB bytes, with its identity for vLLM's caches (the digest and
    the sampling, salted per tenant as an image's)."""

    items: tuple[Any, ...]
    uuids: tuple[str, ...]
    form: Literal["pixels", "embeddings"] = "pixels"  # embeddings: each a ClipEmbedding


@final
@dataclass(frozen=True, slots=True)
class VideoReport:
    """Where one video's frames came from, as an image's (:class:`ImageReport`); ``frames``:
    how many were sampled."""

    digest: str
    outcome: str
    tier: str
    frames: int
    form: Literal["pixels", "embeddings"] = "pixels"


@final
@dataclass(slots=True)
class VideoStats:
    """What the video stage did itself: clips decoded, frames sampled, refusals, decodes
    stopped because nobody waited for them any more."""

    decodes: int = 0
    decode_seconds: float = 0.0
    frames: int = 0
    rejected: int = 0
    not_held: int = 0
    stopped: int = 0
    encodes: int = 0  # clips run through the video tower by mmgate (embeddings mode)
    encode_seconds: float = 0.0


@final
@dataclass(slots=True)
class MediaStats:
    """What the media stage did itself: work the cache saved shows as work not done here."""

    decodes: int = 0
    decode_seconds: float = 0.0
    encodes: int = 0
    encode_seconds: float = 0.0
    rejected: int = 0
    not_held: int = 0
    encode_batches: int = 0


__all__ = [
    "EngineVideos",
    "MediaStats",
    "VideoInput",
    "VideoReport",
    "VideoSampling",
    "VideoStats",
]
