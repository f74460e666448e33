"""What a model folder says about itself: its config, and how many tokens one image takes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["image_tokens", "model_config"]


def model_config(model: str) -> dict[str, Any]:
    """A model's config.json: from its folder, or through transformers for a hub name."""
    folder = Path(model)
    if folder.is_dir():
        config: dict[str, Any] = json.loads((folder / "config.json").read_text())
        return config
    from transformers import AutoConfig

    loaded: dict[str, Any] = AutoConfig.from_pretrained(model).to_dict()
    return loaded


def image_tokens(config: dict[str, Any]) -> int:
    """The positions one image placeholder takes in the engine's prompt (1: not known).

    A LLaVA-family config says it (``image_seq_length``), or its vision tower does: one token per
    patch, plus CLS where the feature select strategy keeps it ("full"). For other families the
    count depends on the image, and 1 (the placeholder itself) is a lower bound: the engine checks
    the real length itself.
    """
    if "vision_config" not in config:
        return 1
    vision = config["vision_config"]
    size, patch = vision.get("image_size"), vision.get("patch_size")
    if size and patch:
        patches = (int(size) // int(patch)) ** 2
        strategy = config.get("vision_feature_select_strategy", "default")
        return patches + (1 if strategy == "full" else 0)
    seq_length = config.get("image_seq_length")
    return int(seq_length) if seq_length else 1
