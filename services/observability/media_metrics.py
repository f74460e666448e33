"""The media pipeline's figures: its own work (decodes, encodes, refusals) and images by URL.

mmgate_media_*_total              decodes, encodes and their seconds, batches, refusals
mmgate_media_video_*_total        clips decoded, their seconds, frames sampled, refusals, clips
                                  referred to by a digest no longer held, decodes stopped, clips
                                  encoded and their seconds
mmgate_image_fetches_total        image URLs asked for, by outcome: miss (fetched), coalesced
                                  (joined a fetch in progress), hit (fetched within the freshness
                                  window), refused (the guard), failed, timeout, bypass
mmgate_image_fetch_bytes_total    bytes fetched
mmgate_image_fetch_seconds        one fetch, redirects included (histogram)
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Final, final

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric

from ..media_types import VideoStats
from ..types import MediaStats
from .histograms import cumulative_buckets

FETCH_BUCKETS: Final = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

_MEDIA_COUNTERS = (
    ("mmgate_media_decodes_total", "decodes", "Images decoded by mmgate."),
    ("mmgate_media_decode_seconds_total", "decode_seconds", "Time spent decoding images."),
    (
        "mmgate_media_encodes_total",
        "encodes",
        "Images run through the vision encoder by mmgate (embeddings mode).",
    ),
    ("mmgate_media_encode_seconds_total", "encode_seconds", "Time spent in the vision encoder."),
    ("mmgate_media_encode_batches_total", "encode_batches", "Runs of the vision encoder."),
    (
        "mmgate_media_rejected_total",
        "rejected",
        "Images refused: corrupt, unsupported, too large or too small.",
    ),
    (
        "mmgate_media_not_held_total",
        "not_held",
        "References to an image the cache no longer held (the client resends its bytes).",
    ),
)


_VIDEO_COUNTERS = (
    ("mmgate_media_video_decodes_total", "decodes", "Video clips decoded by mmgate."),
    (
        "mmgate_media_video_decode_seconds_total",
        "decode_seconds",
        "Time spent decoding video clips.",
    ),
    ("mmgate_media_video_frames_total", "frames", "Frames sampled from decoded video clips."),
    (
        "mmgate_media_video_rejected_total",
        "rejected",
        "Video clips refused: unsupported, corrupt, too large, too long, or too slow to decode.",
    ),
    (
        "mmgate_media_video_not_held_total",
        "not_held",
        "References to a clip the cache no longer held (the client resends its bytes).",
    ),
    (
        "mmgate_media_video_encodes_total",
        "encodes",
        "Video clips run through the video tower by mmgate (embeddings mode).",
    ),
    (
        "mmgate_media_video_encode_seconds_total",
        "encode_seconds",
        "Time spent in the video tower.",
    ),
    (
        "mmgate_media_video_stopped_total",
        "stopped",
        "Clip decodes stopped because no request waited for them any more.",
    ),
)


@final
@dataclass(slots=True)
class FetchStats:
    outcomes: Counter[str] = field(default_factory=Counter)
    bytes: int = 0
    # fetches by the first bucket of FETCH_BUCKETS they fit in (the last: beyond them all)
    counts: list[int] = field(default_factory=lambda: [0] * (len(FETCH_BUCKETS) + 1))
    seconds: float = 0.0

    def observe(self, seconds: float, nbytes: int) -> None:
        self.counts[bisect.bisect_left(FETCH_BUCKETS, seconds)] += 1
        self.seconds += seconds
        self.bytes += nbytes

    def copy(self) -> FetchStats:
        return FetchStats(Counter(self.outcomes), self.bytes, list(self.counts), self.seconds)


def media_families(media: MediaStats) -> Iterator[Metric]:
    for name, attribute, documentation in _MEDIA_COUNTERS:
        yield CounterMetricFamily(name, documentation, value=getattr(media, attribute))


def video_families(videos: VideoStats) -> Iterator[Metric]:
    for name, attribute, documentation in _VIDEO_COUNTERS:
        yield CounterMetricFamily(name, documentation, value=getattr(videos, attribute))


def fetch_families(fetch: FetchStats) -> Iterator[Metric]:
    fetches = CounterMetricFamily(
        "mmgate_image_fetches_total",
        "Image URLs asked for, by outcome: miss (fetched), coalesced (joined a fetch in "
        "progress), hit (fetched within the freshness window), refused (by the address guard), "
        "failed, timeout, bypass (degraded mode).",
        labels=["outcome"],
    )
    for outcome, count in sorted(fetch.outcomes.items()):
        fetches.add_metric([outcome], count)
    yield fetches
    yield CounterMetricFamily(
        "mmgate_image_fetch_bytes_total", "Bytes fetched from image URLs.", value=fetch.bytes
    )
    yield HistogramMetricFamily(
        "mmgate_image_fetch_seconds",
        "One fetch of an image URL, redirects included.",
        buckets=cumulative_buckets(FETCH_BUCKETS, fetch.counts),
        sum_value=fetch.seconds,
    )


__all__ = ["FETCH_BUCKETS", "FetchStats", "fetch_families", "media_families", "video_families"]
