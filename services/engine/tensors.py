"""Tensors as mmgate handles them outside vLLM: their weight, and images in the engine's form."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

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


__all__ = ["engine_image_data", "tensor_nbytes"]
