"""The media plan: what a model's images need, read from its files before the engine starts, and
the media stage built from it once the engine has.

    plan_media(settings, model, dtype, device_share)   (a thread: it reads the model's files,
        │                     loads the encoder on the engine's device, measures what it needs)
        ─▶ MediaPlan(encoder, placeholder tokens, shrink, the engine's share of its device)
        ─▶ plan.intake(): the images the engine's plan takes ─▶ the engine starts
        ─▶ plan.stage(engine, the server's parts): the MediaContext, and the MediaStage on it

mode ``pixels`` never loads the encoder; ``embeddings`` must (or the server does not start);
``auto`` runs it where mmgate reproduces it (the LLaVA family) and it is slow enough for its
cache to pay (``auto_min_encode_ms``, timed here), and leaves the rest to vLLM. Clips follow the
same rule with their own setting (``video_mode``) and encoder (a Qwen2-VL's video tower), timed
on a blank clip of ``_TIMED_FRAMES`` frames.
"""

from __future__ import annotations

import logging
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final, final

from ...config import MediaSettings
from ...engine.placement import Accelerators, EncoderMemory, engine_share
from ...engine.plan import ImageIntake
from ...engine.protocol import ServedEngine
from ...models import image_tokens, model_config, takes_video
from ..cache_front import CacheFront
from ..chaos import NoChaos
from ..threads import ThreadPools
from .context import MediaContext
from .fetch import ImageFetcher
from .stages import MediaStage, media_stage

if TYPE_CHECKING:
    from ...engine.encoder import VisionEncoder
    from ...engine.shrink import ProcessorShrink
    from ...engine.video_encoder import ClipEncoder

log = logging.getLogger("mmgate.media")

# the frames of the blank clip auto times the video tower on
_TIMED_FRAMES: Final = 8


@final
@dataclass(frozen=True, slots=True)
class MediaPlan:
    """What the media stage is built from."""

    settings: MediaSettings
    vision_tower: bool  # the model's config has one
    encoder: VisionEncoder | None  # the vision encoder mmgate runs (embeddings mode)
    placeholder_tokens: int  # the tokens one image placeholder takes in the engine
    shrink: ProcessorShrink | None  # decoded images at the processor's size, where exact
    device_share: float  # the engine's share of its GPU, the encoder's need taken out
    encoder_memory: EncoderMemory | None = None  # what the encoder holds on a GPU
    takes_video: bool = False  # the model's processor takes clips
    clip_encoder: ClipEncoder | None = None  # the clips' tower mmgate runs (embeddings mode)

    @property
    def encoder_dtype(self) -> str | None:
        return None if self.encoder is None else str(self.encoder.dtype)

    def intake(self) -> ImageIntake | None:
        """For the engine's plan: how many images a prompt may take, and in which form."""
        if not self.vision_tower:
            return None
        videos = self.settings.max_videos_per_request if self.takes_video else 0
        return ImageIntake(
            self.settings.max_images_per_request,
            self.encoder is not None,
            videos,
            video_embeddings=self.clip_encoder is not None,
        )

    def stage(
        self,
        cache: CacheFront,
        engine: ServedEngine,
        *,
        threads: ThreadPools,
        chaos: NoChaos,
        fetcher: ImageFetcher,
    ) -> MediaStage:
        """The media stage for the started engine, on the server's parts: chosen once, never
        tested for again."""
        context = MediaContext(
            self.settings,
            cache,
            engine.model_name,
            threads,
            fetcher,
            self.placeholder_tokens,
            encoder=self.encoder,
            shrink=self.shrink,
            chaos=chaos,
            clip_encoder=self.clip_encoder,
        )
        return media_stage(context, takes_images=engine.takes_images, takes_video=self.takes_video)


def plan_media(
    settings: MediaSettings,
    model: str,
    dtype: str,
    *,
    device_share: float,
    accelerators: Accelerators | None = None,
) -> MediaPlan:
    """The plan for ``model`` (a local folder) whose engine runs in ``dtype`` and may take
    ``device_share`` of its GPU (with the encoder); in a thread.

    Raises:
        EncoderDoesNotFit: the encoder would leave the engine too little of its GPU.
    """
    config = model_config(model)
    if "vision_config" not in config:
        return MediaPlan(
            settings,
            vision_tower=False,
            encoder=None,
            placeholder_tokens=1,
            shrink=None,
            device_share=device_share,
        )
    # torch is the engine's: loaded here only for a vision model
    from ...engine.encoder import VisionEncoder
    from ...engine.placement import TorchAccelerators
    from ...engine.shrink import ProcessorShrink

    video = takes_video(model)
    accelerators = accelerators if accelerators is not None else TorchAccelerators()
    device = accelerators.engine_device()
    encoder = None
    if settings.mode != "pixels":
        try:
            encoder = VisionEncoder.load(
                Path(model), dtype=settings.encoder_dtype or dtype, device=device or "cpu"
            )
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
    if encoder is not None and settings.mode == "auto" and not _pays(encoder, settings):
        encoder = None
        if device is not None:
            # what torch's allocator kept of the tower goes back before vLLM counts free memory
            accelerators.release(device)
    memory = None
    if encoder is not None and device is not None:
        memory = _measure(encoder, accelerators, device, settings.encode_batch)
        log.info("%s", memory.describe())
    return MediaPlan(
        settings,
        vision_tower=True,
        encoder=encoder,
        placeholder_tokens=image_tokens(config),
        shrink=ProcessorShrink.load(Path(model)) if settings.shrink_images else None,
        device_share=engine_share(device_share, memory),
        encoder_memory=memory,
        takes_video=video,
        clip_encoder=_clip_encoder(Path(model), settings, dtype, device) if video else None,
    )


def encode_ms(encoder: VisionEncoder, runs: int = 3) -> float:
    """The encoder's time for one image, processor included: the median of ``runs`` (the first
    run, in load(), warmed it)."""
    (image,) = encoder.blank_images(1)
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        encoder.encode([image])
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def _clip_encoder(
    model: Path, settings: MediaSettings, dtype: str, device: str | None
) -> ClipEncoder | None:
    """The clips' tower mmgate runs, by ``video_mode``: embeddings must load it, auto loads it
    where it can and keeps it where a clip's encode is slow enough to pay, logged with why."""
    if settings.video_mode == "pixels":
        return None
    from ...engine.video_encoder import ClipEncoder

    try:
        encoder = ClipEncoder.load(
            model, dtype=settings.encoder_dtype or dtype, device=device or "cpu"
        )
    except (ValueError, OSError) as exc:
        if settings.video_mode == "embeddings":
            raise RuntimeError(
                f"video mode 'embeddings': mmgate cannot run the video tower of {model} ({exc});"
                " use 'auto' or 'pixels'"
            ) from None
        log.warning("not running the video tower in mmgate: %s", exc)
        return None
    if settings.video_mode == "embeddings":
        return encoder
    frames = encoder.blank_frames(_TIMED_FRAMES)
    encoder.encode(frames)
    started = time.perf_counter()
    encoder.encode(frames)
    per_frame = (time.perf_counter() - started) * 1000 / _TIMED_FRAMES
    bound = settings.auto_min_encode_ms
    chose = "embeddings" if per_frame >= bound else "pixels"
    log.info(
        "video mode auto chose %s: the video tower takes %.2f ms a frame on %s "
        "(MMGATE_MEDIA__AUTO_MIN_ENCODE_MS %g ms)",
        chose,
        per_frame,
        encoder.device,
        bound,
    )
    return encoder if chose == "embeddings" else None


def _pays(encoder: VisionEncoder, settings: MediaSettings) -> bool:
    """auto: whether caching this encoder's output pays for handing it over, logged with why."""
    took = encode_ms(encoder)
    bound = settings.auto_min_encode_ms
    if took < bound:
        log.info(
            "media mode auto chose pixels: the vision encoder takes %.2f ms an image on %s, "
            "under MMGATE_MEDIA__AUTO_MIN_ENCODE_MS (%g ms); caching its output would save "
            "less than handing it to the engine costs on every new image",
            took,
            encoder.device,
            bound,
        )
        return False
    log.info(
        "media mode auto chose embeddings: the vision encoder takes %.2f ms an image on %s "
        "(MMGATE_MEDIA__AUTO_MIN_ENCODE_MS %g ms)",
        took,
        encoder.device,
        bound,
    )
    return True


def _measure(
    encoder: VisionEncoder, accelerators: Accelerators, device: str, batch: int
) -> EncoderMemory:
    """The encoder's weights and the activations of its largest batch on ``device``."""
    images = encoder.blank_images(batch)
    activations = accelerators.peak_bytes(device, lambda: encoder.forward(encoder.pixels(images)))
    _, total = accelerators.memory(device)
    return EncoderMemory(device, encoder.weight_bytes, activations, total)


__all__ = ["MediaPlan", "encode_ms", "plan_media"]
