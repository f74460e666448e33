"""Images: the codec (bytes to pixels), one stage class per media mode (stages.py), and the plan
they are built from, read from the model before the engine starts (plan.py)."""

from .codec import FORMATS, DecodedImage, decode, sniff
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
    "MediaPlan",
    "MediaStage",
    "NoImages",
    "PixelsStage",
    "PreparedImages",
    "decode",
    "media_stage",
    "plan_media",
    "sniff",
]
