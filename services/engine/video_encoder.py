"""The clip encoder: a clip's sampled frames to the embeddings a Qwen2-VL model's language model
reads, run by mmgate so that its cache keeps them.

    frames (n, H, W, 3) RGB ──▶ the model's video processor (as vLLM loads it): resized,
                                 normalised, cut in 14-pixel patches, frames paired in time
                                 │ pixel_values_videos (patches, 3 x 2 x 14 x 14), grid (t, h, w)
                                 ▼
                            vision tower (Qwen2VisionTransformerPretrainedModel), its merger
                                 │ (t x h x w / merge², text hidden size)
                                 ▼
    ClipEmbedding(embeds, grid) ─▶ mmgate's cache (memory, Redis) ─▶ vLLM, started with
         enable_mm_embeds=True, given {"video": {"video_embeds", "video_grid_thw"}}

vLLM runs the same processor and tower on the frames itself; here the result is kept. Greedy
answers from either are the same in float32 (tests/services/pipeline/test_video_embeddings.py).
On a CPU the tower's linear layers run vLLM's own kernel, as in its engine (cpu_gemm.py).
Only the tower's weights are read from the checkpoint (``visual.*`` or ``model.visual.*``, one
by one), never the language model's. :meth:`ClipEncoder.encode` is synchronous, for a worker
thread, and holds no mutable state.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, final

from .encoder import checkpoint_tensors
from .vision_compat import ensure_torchvision_importable

if TYPE_CHECKING:
    import numpy as np
    import torch

__all__ = ["ClipEmbedding", "ClipEncoder", "takes_clip_encoder"]

# the model families whose tower this runs, by config.json's model_type
_FAMILIES: Final = frozenset({"qwen2_vl"})
_PREFIXES: Final = ("model.visual.", "visual.")


@final
@dataclass(frozen=True, slots=True, eq=False)
class ClipEmbedding:
    """A clip's embeddings, (t x h x w / merge², hidden), its patch grid (t, h, w), which sizes
    the clip's placeholder in the engine's prompt, and the frames they were made of."""

    embeds: Any  # torch.Tensor
    grid: tuple[int, int, int]
    frames: int

    @property
    def nbytes(self) -> int:
        return int(self.embeds.element_size() * self.embeds.nelement())


def takes_clip_encoder(model_dir: Path) -> bool:
    """Whether this encoder runs the model's tower (a Qwen2-VL)."""
    try:
        config = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return config.get("model_type") in _FAMILIES


@final
class ClipEncoder:
    """A Qwen2-VL model's video processor and vision tower."""

    __slots__ = ("_device", "_processor", "_tower")

    def __init__(self, processor: Any, tower: Any, device: str) -> None:
        self._processor = processor
        self._tower = tower
        self._device = device

    @classmethod
    def load(cls, model_dir: Path, *, dtype: str, device: str = "cpu") -> ClipEncoder:
        """The tower of the model at ``model_dir`` in ``dtype`` on ``device``.

        Raises:
            ValueError: not a model family this encoder runs, or its weights are not all there.
        """
        if not takes_clip_encoder(model_dir):
            raise ValueError(f"{model_dir}: mmgate runs the video tower of Qwen2-VL models only")
        ensure_torchvision_importable()
        import torch
        from transformers import AutoConfig, AutoProcessor
        from transformers.models.qwen2_vl.modeling_qwen2_vl import (
            Qwen2VisionTransformerPretrainedModel,
        )

        from .cpu_gemm import pack_linears

        config = AutoConfig.from_pretrained(model_dir)
        torch_dtype = getattr(torch, dtype) if dtype not in ("auto", "") else torch.float32
        # built where it runs (its rotary tables are buffers the checkpoint does not hold),
        # then every weight replaced by the checkpoint's
        tower = Qwen2VisionTransformerPretrainedModel._from_config(config.vision_config)
        weights = checkpoint_tensors(model_dir, _PREFIXES)
        missing = set(tower.state_dict()) - set(weights)
        if missing:
            raise ValueError(f"{model_dir}: the video tower lacks {len(missing)} weights")
        tower.load_state_dict(weights, strict=False)
        tower = tower.to(device=device, dtype=torch_dtype).eval()
        pack_linears(tower)  # on a CPU, as vLLM runs its own tower's layers
        processor = AutoProcessor.from_pretrained(model_dir).video_processor
        encoder = cls(processor, tower, device)
        encoder.encode(encoder.blank_frames(2))  # warm: the first run pays for allocations
        return encoder

    @property
    def dtype(self) -> torch.dtype:
        return next(self._tower.parameters()).dtype

    @property
    def device(self) -> str:
        return self._device

    def blank_frames(self, count: int, side: int = 224) -> np.ndarray:
        import numpy as np

        return np.full((count, side, side, 3), 127, dtype=np.uint8)

    def encode(self, frames: np.ndarray) -> ClipEmbedding:
        """One clip's frames, (n, H, W, 3) RGB bytes, to its embeddings (on the CPU)."""
        import torch

        processed = self._processor(videos=[frames], return_tensors="pt")
        pixels = processed["pixel_values_videos"].to(device=self._device, dtype=self.dtype)
        grid = processed["video_grid_thw"]
        with torch.inference_mode():
            out = self._tower(pixels, grid_thw=grid.to(self._device))
        embeds = getattr(out, "pooler_output", out)
        t, h, w = (int(v) for v in grid[0].tolist())
        return ClipEmbedding(embeds.detach().to("cpu").contiguous(), (t, h, w), len(frames))
