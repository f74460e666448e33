"""What a server's media stage is built on, in one object: made once by the plan (plan.py) when
the engine has started, from the server's parts and the plan's reading of the model.

    the server's parts   cache front, thread pools, fault injection, the URL fetcher
    the plan's reading   media settings, the model's name, placeholder tokens, the encoders
                         mmgate runs (embeddings mode: images', clips'), the processor's shrink
        ─▶ MediaContext ─▶ media_stage(context): the variant, holding it (stages.py)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, final

from PIL import Image

from ...config import MediaSettings
from ..cache_front import CacheFront
from ..chaos import NoChaos
from ..threads import ThreadPools
from .fetch import ImageFetcher

if TYPE_CHECKING:
    from ...engine.encoder import VisionEncoder
    from ...engine.video_encoder import ClipEncoder

# An image as the model's processor will resize it (services/engine/shrink.py), handed in by
# the plan; None: stored as decoded.
Shrink = Callable[[Image.Image], Image.Image]


@final
@dataclass(frozen=True, slots=True)
class MediaContext:
    """One server's media state, shared by every request its media stage serves."""

    settings: MediaSettings
    cache: CacheFront
    model_name: str  # the served model: every image key is under its name
    threads: ThreadPools  # hashing, decoding and encoding run in their pools
    fetcher: ImageFetcher  # images by URL: the server's, which closes it
    placeholder_tokens: int  # the positions one image placeholder takes in the engine's prompt
    encoder: VisionEncoder | None = None  # run by mmgate (embeddings mode); None: by the engine
    shrink: Shrink | None = None  # what the cache stores of a decoded image, where exact
    clip_encoder: ClipEncoder | None = None  # a clip's tower, run by mmgate; None: by the engine
    chaos: NoChaos = field(default_factory=NoChaos)  # faults on purpose (reliability runs only)


__all__ = ["MediaContext", "Shrink"]
