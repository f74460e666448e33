"""What a model folder says about itself: its config, how many tokens one image takes, and
whether it takes video."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

__all__ = ["image_tokens", "model_config", "model_fingerprint", "takes_video"]


def model_config(model: str) -> dict[str, Any]:
    """A model's config.json: from its folder, or through transformers for a hub name."""
    folder = Path(model)
    if folder.is_dir():
        config: dict[str, Any] = json.loads((folder / "config.json").read_text())
        return config
    from transformers import AutoConfig

    loaded: dict[str, Any] = AutoConfig.from_pretrained(model).to_dict()
    return loaded


def takes_video(model: str) -> bool:
    """Whether the model's processor has a video processor (vLLM serves video through it):
    in processor_config.json, as transformers 5 saves it, or in a file of its own, as earlier
    versions did. A name only the engine resolves: no."""
    folder = Path(model)
    if (folder / "video_preprocessor_config.json").is_file():
        return True
    processor = folder / "processor_config.json"
    if not processor.is_file():
        return False
    try:
        return "video_processor" in json.loads(processor.read_text())
    except (ValueError, TypeError):
        return False


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


# of each model file, this much of its start and end goes into the fingerprint
_FINGERPRINT_SPAN = 1 << 20


def model_fingerprint(model: str) -> str:
    """The model's identity by content, not by its name or path: every file's name and size, and
    a digest of its first and last MiB (a weight file's header and some of its tensors). Two
    folders called "model" holding different weights differ; two copies of one model agree."""
    digest = hashlib.sha256()
    root = Path(model)
    if not root.is_dir():  # a name only the engine resolves: the name is all there is
        digest.update(model.encode())
    for path in sorted(p for p in root.rglob("*") if p.is_file() and not p.name.startswith(".")):
        size = path.stat().st_size
        digest.update(f"{path.relative_to(root)}\0{size}\0".encode())
        with path.open("rb") as data:
            digest.update(data.read(_FINGERPRINT_SPAN))
            if size > 2 * _FINGERPRINT_SPAN:
                data.seek(-_FINGERPRINT_SPAN, 2)
                digest.update(data.read())
    return digest.hexdigest()
