"""Images and videos: the codecs (bytes to pixels: codec.py, video.py), one stage class per
media mode (stages.py) and the videos' stage beside it (videos.py) on one context per server
(context.py), media by URL (fetch.py), and the plan they are built from, read from the model
before the engine starts (plan.py)."""

from .codec import FORMATS, DecodedImage, decode, limit_pixels, sniff
from .context import MediaContext
from .fetch import ImageFetcher
from .plan import MediaPlan, plan_media
from .stages import (
    Embedding,
    EmbeddingsStage,
    MediaStage,
    NoImages,
    PixelsStage,
    PreparedImages,
    media_stage,
)
from .video import VideoFrames, VideoLimits, decode_video, sniff_video
from .videos import (
    ClipFrames,
    NoVideos,
    PreparedVideos,
    VideoEmbeddingsStage,
    Videos,
    VideoStage,
    video_stage,
)

__all__ = [
    "FORMATS",
    "ClipFrames",
    "DecodedImage",
    "Embedding",
    "EmbeddingsStage",
    "ImageFetcher",
    "MediaContext",
    "MediaPlan",
    "MediaStage",
    "NoImages",
    "NoVideos",
    "PixelsStage",
    "PreparedImages",
    "PreparedVideos",
    "VideoEmbeddingsStage",
    "VideoFrames",
    "VideoLimits",
    "VideoStage",
    "Videos",
    "decode",
    "decode_video",
    "limit_pixels",
    "media_stage",
    "plan_media",
    "sniff",
    "sniff_video",
    "video_stage",
]
