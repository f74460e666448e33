"""The media plan: what a model's images need, read from its files before the engine starts, and
the media stage built from it once the engine has.

    plan_media(settings, model, dtype)   (a thread: it reads the model's files, loads the encoder)
        ─▶ MediaPlan(encoder, placeholder tokens, shrink)
        ─▶ plan.configure(engine)  ─▶ the engine starts  ─▶ plan.stage(...): the MediaStage

mode ``pixels`` never loads the encoder; ``embeddings`` must (or the server does not start);
``auto`` runs it where mmgate reproduces it (the LLaVA family) and leaves the rest to vLLM.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, final

from cache_actor import CacheActor

from ...config import MediaSettings
from ...models import image_tokens, model_config
from ..chaos import NoChaos
from ..threads import ThreadPools
from .stages import MediaStage, media_stage

if TYPE_CHECKING:
    from ...engine.encoder import VisionEncoder
    from ...engine.shrink import ProcessorShrink
    from ...engine.worker import EngineWorker

log = logging.getLogger("mmgate.media")


@final
@dataclass(frozen=True, slots=True)
class MediaPlan:
    """What the media stage is built from."""

    settings: MediaSettings
    vision_tower: bool  # the model's config has one
    encoder: VisionEncoder | None  # the vision encoder mmgate runs (embeddings mode)
    placeholder_tokens: int  # the tokens one image placeholder takes in the engine
    shrink: ProcessorShrink | None  # decoded images at the processor's size, where exact

    @property
    def encoder_dtype(self) -> str | None:
        return None if self.encoder is None else str(self.encoder.dtype)

    def configure(self, engine: EngineWorker) -> None:
        """Before the engine starts: how many images a prompt may take, and in which form."""
        if self.vision_tower:
            engine.accept_images(
                per_prompt=self.settings.max_images_per_request,
                embeddings=self.encoder is not None,
            )

    def stage(
        self, cache: CacheActor, engine: EngineWorker, *, threads: ThreadPools, chaos: NoChaos
    ) -> MediaStage:
        """The media stage for the started engine: chosen once, never tested for again."""
        return media_stage(
            self.settings,
            cache,
            engine.model_name,
            takes_images=engine.takes_images,
            encoder=self.encoder,
            placeholder_tokens=self.placeholder_tokens,
            threads=threads,
            shrink=self.shrink,
            chaos=chaos,
        )


def plan_media(settings: MediaSettings, model: str, dtype: str) -> MediaPlan:
    """The plan for ``model`` (a local folder) whose engine runs in ``dtype``; in a thread."""
    config = model_config(model)
    if "vision_config" not in config:
        return MediaPlan(
            settings, vision_tower=False, encoder=None, placeholder_tokens=1, shrink=None
        )
    # torch is the engine's: loaded here only for a vision model
    from ...engine.encoder import VisionEncoder
    from ...engine.shrink import ProcessorShrink

    encoder = None
    if settings.mode != "pixels":
        try:
            encoder = VisionEncoder.load(Path(model), dtype=settings.encoder_dtype or dtype)
        except (ValueError, OSError) as exc:
            if settings.mode == "embeddings":
                raise
            # auto: a LLaVA variant this encoder does not reproduce; vLLM encodes it
            log.warning("not running the vision encoder in mmgate: %s", exc)
        if encoder is None and settings.mode == "embeddings":
            raise RuntimeError(
                f"media mode 'embeddings': mmgate cannot run the vision encoder of {model} "
                "(LLaVA-family models only); use 'auto' or 'pixels'"
            )
    return MediaPlan(
        settings,
        vision_tower=True,
        encoder=encoder,
        placeholder_tokens=image_tokens(config),
        shrink=ProcessorShrink.load(Path(model)) if settings.shrink_images else None,
    )


__all__ = ["MediaPlan", "plan_media"]
