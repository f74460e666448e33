"""Tensors as mmgate handles them outside vLLM: their weight, and images and clips in the
engine's form."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..media_types import EngineVideos
from ..types import EngineImages

if TYPE_CHECKING:
    import torch


def tensor_nbytes(tensor: torch.Tensor) -> int:
    """Bytes held by ``tensor``'s elements: what an embeddings value weighs in the cache."""
    return int(tensor.element_size() * tensor.nelement())


def engine_image_data(images: EngineImages) -> Any:
    """``multi_modal_data["image"]``: the PIL images (pixels), or one stacked tensor."""
    if images.form == "pixels":
        return list(images.items)
    import torch

    # embeddings: one tensor (images, image tokens, hidden), which vLLM takes as precomputed
    return torch.stack(list(images.items))


def engine_video_data(videos: EngineVideos) -> Any:
    """``multi_modal_data["video"]``: each clip's frames (pixels), or every clip's embeddings
    together with their patch grids, as vLLM's Qwen2-VL takes precomputed ones."""
    if videos.form == "pixels":
        return list(videos.items)
    import torch

    return {
        "video_embeds": torch.cat([clip.embeds for clip in videos.items]),
        "video_grid_thw": torch.tensor([list(clip.grid) for clip in videos.items]),
    }


__all__ = ["engine_image_data", "engine_video_data", "tensor_nbytes"]
