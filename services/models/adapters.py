"""Test LoRA adapters, built here from a model folder: random low-rank weights, seeded.

    mmgate models adapter MODEL PATH [--seed N] [--rank R] [--vision]

The PEFT layout vLLM reads: ``adapter_config.json`` and ``adapter_model.safetensors`` with
``base_model.model.<module>.lora_A.weight`` (rank x in) and ``lora_B.weight`` (out x rank) for
the attention projections of every language-model layer. The weights are scaled so that the
adapter's change to each projection is as large as the projection itself: greedy answers through
it differ from the base model's, and two seeds differ from each other. ``vision`` adds one layer of
the vision tower too: an adapter mmgate refuses in embeddings mode, where it runs the tower itself.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Final

from .build import build_once

__all__ = ["adapter_shapes", "build_test_adapter"]

_TARGETS: Final = ("q_proj", "v_proj")
_DTYPE_NAME: Final = "float32"
# how much larger than the projection itself the adapter's change is: at 1, some seeds left
# SmolLM2's short greedy answers as they were
_STRENGTH: Final = 3.0


def _text_config(model: Path) -> tuple[dict[str, Any], str]:
    """The language model's config and the prefix of its layers in PEFT's names."""
    config = json.loads((model / "config.json").read_text())
    if "text_config" in config:
        # transformers' LLaVA layout since 4.52 (vLLM maps it onto its own)
        return config["text_config"], "model.language_model.layers"
    return config, "model.layers"


def adapter_shapes(text: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """(in, out) features of each projection a LoRA adapter may target in a Llama-family layer."""
    hidden = int(text["hidden_size"])
    heads = int(text["num_attention_heads"])
    head_dim = int(text.get("head_dim") or hidden // heads)
    kv = int(text.get("num_key_value_heads") or heads) * head_dim
    inner = int(text["intermediate_size"])
    return {
        "q_proj": (hidden, heads * head_dim),
        "k_proj": (hidden, kv),
        "v_proj": (hidden, kv),
        "o_proj": (heads * head_dim, hidden),
        "gate_proj": (hidden, inner),
        "up_proj": (hidden, inner),
        "down_proj": (inner, hidden),
    }


def build_test_adapter(
    model: Path, path: Path, *, seed: int = 0, rank: int = 8, vision: bool = False
) -> Path:
    """Build a seeded random LoRA adapter of ``model``'s language model at ``path`` (once)."""
    recipe = {
        "kind": "test-adapter",
        "model": model.name,
        "seed": seed,
        "rank": rank,
        "vision": vision,
        "dtype": _DTYPE_NAME,
    }
    return build_once(path, recipe, lambda tmp: _write(model, tmp, seed, rank, vision))


def _write(model: Path, out: Path, seed: int, rank: int, vision: bool) -> None:
    import torch
    from safetensors.torch import save_file

    text, layers = _text_config(model)
    shapes = adapter_shapes(text)
    modules = [
        (f"{layers}.{i}.self_attn.{target}", shapes[target])
        for i in range(int(text["num_hidden_layers"]))
        for target in _TARGETS
    ]
    if vision:
        tower = json.loads((model / "config.json").read_text())["vision_config"]
        side = int(tower["hidden_size"])
        layer = "model.vision_tower.vision_model.encoder.layers.0"
        modules.append((f"{layer}.self_attn.q_proj", (side, side)))
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, (fan_in, fan_out) in modules:
        # B A x a few times W x for the unit-scale tiny models and SmolLM2 alike: A keeps the
        # input's size, B spreads it over the output (scaling alpha / rank = 1)
        a = torch.randn(rank, fan_in, generator=generator) / math.sqrt(fan_in)
        b = torch.randn(fan_out, rank, generator=generator) * (_STRENGTH / math.sqrt(rank))
        tensors[f"base_model.model.{name}.lora_A.weight"] = a.contiguous()
        tensors[f"base_model.model.{name}.lora_B.weight"] = b.contiguous()
    save_file(tensors, out / "adapter_model.safetensors", metadata={"format": "pt"})
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": model.name,
        "r": rank,
        "lora_alpha": rank,
        "lora_dropout": 0.0,
        "bias": "none",
        "target_modules": list(_TARGETS),
        "fan_in_fan_out": False,
        "inference_mode": True,
    }
    (out / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n")
