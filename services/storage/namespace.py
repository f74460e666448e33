"""The second tier's namespace: a fingerprint, by content, of everything that changes a value.

Two deployments share a Redis only where their values are the same: the model's files, the
engine's and the encoder's dtypes, the processor's image settings and the value format. Any of
them changed, and the keys change with it: nothing written before is read as if it still held.
"""

from __future__ import annotations

from ..config import MediaSettings
from ..engine.values import VERSION as VALUE_FORMAT
from ..keys import cache_key
from ..models import model_fingerprint


def tier_namespace(
    model: str, *, dtype: str, encoder_dtype: str | None, media: MediaSettings
) -> str:
    """The namespace of ``model`` (a local folder) served as described; reads the model's files
    (call it in a thread)."""
    identity = {
        "model": model_fingerprint(model),
        "dtype": dtype,
        "encoder_dtype": encoder_dtype,
        "shrink_images": media.shrink_images,
        "max_image_pixels": media.max_image_pixels,
        "format": VALUE_FORMAT,
    }
    return cache_key("mmgate", "tier-namespace", identity)[:32]


__all__ = ["tier_namespace"]
