"""Images: the codec (bytes to pixels) and one stage class per media mode (stages.py)."""

from .codec import FORMATS, DecodedImage, decode, sniff
from .stages import (
    Embedding,
    EmbeddingsStage,
    MediaStage,
    NoImages,
    NotReady,
    PixelsStage,
    PreparedImages,
    media_stage,
)

__all__ = [
    "FORMATS",
    "DecodedImage",
    "Embedding",
    "EmbeddingsStage",
    "MediaStage",
    "NoImages",
    "NotReady",
    "PixelsStage",
    "PreparedImages",
    "decode",
    "media_stage",
    "sniff",
]
