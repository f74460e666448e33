"""Decoded images shrunk to the size the model's image processor resizes them to, exactly.

    decoded RGB (e.g. 6000x6000, 108 MB) ──▶ the processor's own resize (same sizes, same filter)
        ──▶ 80x56 RGB (13 KB): what the cache stores ──▶ engine: its processor resizes it to the
            same size (a no-op), so pixel_values, and every token after them, are unchanged

A 131 KB PNG of 40 megapixels decodes to 120 MB of RGB; stored whole, five of them filled the
default cache. A fixed-resolution processor (CLIP's: shortest edge, centre crop) throws most of
it away anyway, so only what it keeps is stored. Only where that is exact: the processor must
resize to a fixed shortest edge, with no tiles or pixel budgets (dynamic-resolution processors
keep the original), and at load a check on images of awkward sizes must give identical
``pixel_values`` from the original and from the shrunk image; otherwise ``load`` returns None
and images are stored as decoded.
"""

from __future__ import annotations

import logging
import random
from pathlib import Path
from typing import Any, final

from PIL import Image

log = logging.getLogger("mmgate.media")

# what the load-time check resizes: landscape, portrait, odd sides, one side just above the edge
CHECK_SIZES = ((1000, 700), (333, 1201), (257, 203))
# processor settings of dynamic resolution: the original image is what they need
DYNAMIC = ("image_grid_pinpoints", "min_pixels", "max_pixels", "max_image_tiles", "do_pan_and_scan")


@final
class ProcessorShrink:
    """Shrinks an image as the processor's resize step would (and leaves smaller ones alone)."""

    def __init__(self, processor: Any) -> None:
        self._processor = processor
        self.shortest_edge = int(processor.size.shortest_edge)

    @classmethod
    def load(cls, model_dir: Path) -> ProcessorShrink | None:
        """The model's image processor as a shrink, or None where shrinking is not exact."""
        from transformers import AutoImageProcessor

        try:
            processor = AutoImageProcessor.from_pretrained(model_dir)
        except (OSError, ValueError) as exc:
            log.info("images stored as decoded: no image processor to follow (%s)", exc)
            return None
        reason = cls._fixed_resolution(processor)
        if reason is not None:
            log.info("images stored as decoded: %s", reason)
            return None
        shrink = cls(processor)
        if not shrink._exact():
            log.info("images stored as decoded: shrinking would change the processor's output")
            return None
        return shrink

    @staticmethod
    def _fixed_resolution(processor: Any) -> str | None:
        """Why ``processor`` is not one whose resize can be done ahead; None when it is."""
        if not getattr(processor, "do_resize", False):
            return "the processor does not resize"
        if any(getattr(processor, name, None) for name in DYNAMIC):
            return "the processor has a dynamic resolution"
        size = getattr(processor, "size", None)
        if size is None or not getattr(size, "shortest_edge", None):
            return "the processor does not resize to a shortest edge"
        if getattr(size, "longest_edge", None) or getattr(size, "height", None):
            return "the processor resizes to more than a shortest edge"
        if not hasattr(processor, "resize"):
            return "the processor has no resize of its own"
        return None

    def __call__(self, image: Image.Image) -> Image.Image:
        if min(image.size) <= self.shortest_edge:
            return image
        from torchvision.transforms.v2 import functional

        processor = self._processor
        resized = processor.resize(
            functional.pil_to_tensor(image), size=processor.size, resample=processor.resample
        )
        shrunk: Image.Image = functional.to_pil_image(resized)
        return shrunk

    def _exact(self) -> bool:
        import torch

        rng = random.Random(0)
        try:
            for width, height in CHECK_SIZES:
                image = Image.frombytes("RGB", (width, height), rng.randbytes(width * height * 3))
                original = self._pixel_values(image)
                shrunk = self._pixel_values(self(image))
                if original.shape != shrunk.shape or not torch.equal(original, shrunk):
                    return False
        except (ImportError, TypeError, ValueError, RuntimeError, AttributeError):
            return False  # a processor whose resize takes other arguments: not one to follow
        return True

    def _pixel_values(self, image: Image.Image) -> Any:
        return self._processor(images=[image], return_tensors="pt")["pixel_values"]


__all__ = ["ProcessorShrink"]
