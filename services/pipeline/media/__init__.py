"""Images: the codec (bytes to pixels), one stage class per media mode (stages.py) on one
context per server (context.py), images by URL (fetch.py), and the plan they are built from,
read from the model before the engine starts (plan.py)."""

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

__all__ = [
    "FORMATS",
    "DecodedImage",
    "Embedding",
    "EmbeddingsStage",
    "ImageFetcher",
    "MediaContext",
    "MediaPlan",
    "MediaStage",
    "NoImages",
    "PixelsStage",
    "PreparedImages",
    "decode",
    "limit_pixels",
    "media_stage",
    "plan_media",
    "sniff",
]
