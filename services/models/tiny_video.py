"""A tiny random-weight Qwen2-VL for video tests, built here from a config: no hub, no download.

    video frames (n, h, w, 3) ─▶ Qwen2-VL video processor: each frame resized to ~56x56 pixels
        (min_pixels = max_pixels = 56*56), frames taken in pairs (temporal patch 2; an odd last
        frame is repeated) ─▶ 4x4 patches of 14 px a pair ─▶ vision tower (2 blocks, width 64)
        ─▶ merger: 2x2 patches into one ─▶ 4 embeddings of 128 a pair ─▶ Qwen2 (2 layers, M-RoPE)
    image (h, w, 3) ─▶ the same, as one frame repeated to a pair ─▶ 4 embeddings

It is served by vLLM's ``Qwen2VLForConditionalGeneration`` like any Qwen2-VL checkpoint, with
videos, images, and both in one prompt, in seconds on a CPU. The weights are random and scaled as
the tiny LLaVA's are (services/models/tiny_llava.py): unit-size activations, logits spread wide,
so greedy decoding gives varied tokens that one frame more or less changes.

Token counts: a square frame (or image) is resized to exactly 56x56, so each pair of frames
takes 4 positions. Qwen2-VL keeps the aspect ratio (its ``smart_resize`` rounds each side to 28
pixels within the pixel bounds), so other shapes take fewer: a 64x80 frame becomes 28x56, 2
positions a pair. The chat template writes one ``<|video_pad|>`` (or ``<|image_pad|>``) between
``<|vision_start|>`` and ``<|vision_end|>``; the processor expands it to the real count.

float32, as the tiny LLaVA, so that the vision tower's kernels in vLLM and transformers agree.

Beside it, :func:`build_qwen2vl_video`: the same tiny Qwen2 behind a vision tower of
Qwen2-VL-2B-Instruct's shape (:data:`QWEN2VL_2B_TOWER`: 32 blocks, width 1280), frames resized to
84x84 (9 positions a pair, 36 a clip of 8 frames), so that the tower costs a real model's time:
about 1.7 s a clip of 8 frames on one CPU thread. For benchmarks of mmgate's embeddings mode.

    mmgate models tiny-video PATH [--seed N]
    mmgate models qwen2vl-video PATH [--seed N]
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

from . import tiny_llava
from .build import build_once
from .tiny import train_tiny_tokenizer

__all__ = [
    "IMAGE_PAD_TOKEN",
    "QWEN2VL_2B_TOWER",
    "TINY_VIDEO_FRAME_SIZE",
    "TINY_VIDEO_TOWER",
    "VIDEO_CHAT_TEMPLATE",
    "VIDEO_TOKEN",
    "VISION_END_TOKEN",
    "VISION_START_TOKEN",
    "VideoTower",
    "build_qwen2vl_video",
    "build_tiny_video",
    "engine_settings",
]

# Qwen2-VL's own special tokens, added to the tiny tokenizer in this order
VISION_START_TOKEN: Final = "<|vision_start|>"
VISION_END_TOKEN: Final = "<|vision_end|>"
IMAGE_PAD_TOKEN: Final = "<|image_pad|>"
VIDEO_TOKEN: Final = "<|video_pad|>"

# a square frame's side after the processor's resize: 4x4 patches of 14, merged 2x2
TINY_VIDEO_FRAME_SIZE: Final = 56
_PATCH_SIZE: Final = 14
_TEXT_HIDDEN_SIZE: Final = 128
_MERGE: Final = 2  # spatial merge: 2x2 patches into one position


@dataclass(frozen=True, slots=True)
class VideoTower:
    """The shape of a Qwen2-VL vision tower (14-pixel patches, temporal patch 2, 2x2 merge) and
    the side of the square its processor resizes each frame to."""

    frame_size: int
    depth: int
    embed_dim: int
    num_heads: int
    mlp_ratio: int

    @property
    def pair_tokens(self) -> int:
        """Positions a square frame pair (or an image) takes in the language model."""
        return (self.frame_size // (_PATCH_SIZE * _MERGE)) ** 2


TINY_VIDEO_TOWER: Final = VideoTower(TINY_VIDEO_FRAME_SIZE, 2, 64, 2, 2)
# Qwen/Qwen2-VL-2B-Instruct's vision tower (~0.6 G parameters); 84x84 frames keep a clip of 8
# frames near 1.7 s on one CPU thread (the 32 blocks' weights, read once a run, dominate it)
QWEN2VL_2B_TOWER: Final = VideoTower(84, 32, 1280, 16, 4)

_DTYPE_NAME: Final = "float32"

# Standard deviation of the logits over the vocabulary, for a unit-size final hidden state.
_LOGIT_SCALE: Final = 6.0

_IMAGE_PART: Final = VISION_START_TOKEN + IMAGE_PAD_TOKEN + VISION_END_TOKEN
_VIDEO_PART: Final = VISION_START_TOKEN + VIDEO_TOKEN + VISION_END_TOKEN

# ChatML with image and video content parts, each as Qwen2-VL's vision tokens
VIDEO_CHAT_TEMPLATE: Final = tiny_llava.chatml_template(
    {"image": _IMAGE_PART, "video": _VIDEO_PART}
)


def engine_settings(path: Path, *, max_model_len: int = 1024) -> dict[str, Any]:
    """How tests serve it (``Settings(engine=...)``): the tiny LLaVA's small context and KV
    cache, in float32, with room for a clip's frames."""
    return tiny_llava.engine_settings(path, max_model_len=max_model_len)


def build_tiny_video(path: Path, *, seed: int = 0) -> Path:
    """Build a tiny random-weight Qwen2-VL at ``path`` (once) and return ``path``.

    Vision tower: 2 blocks, width 64, 2 heads, 14-pixel patches, temporal patch 2, 2x2 merge.
    Qwen2: 2 layers, hidden 128, 4 heads of 32, M-RoPE sections (4, 6, 6), 4096 positions, the
    tokenizer of :func:`services.models.tiny.build_tiny_model` plus Qwen2-VL's four vision
    tokens. ``seed`` fixes the weights; the tokenizer is the same for every seed. About 3 MB.

    Raises:
        FileExistsError: ``path`` holds something else: another seed, or no marker.
    """
    recipe = {"kind": "tiny-video", "seed": seed, "dtype": _DTYPE_NAME}
    return build_once(path, recipe, lambda tmp: _write_tiny_video(tmp, seed, TINY_VIDEO_TOWER))


def build_qwen2vl_video(path: Path, *, seed: int = 0) -> Path:
    """Build a random-weight Qwen2-VL with a Qwen2-VL-2B-shaped vision tower at ``path`` (once).

    The tiny Qwen2 of :func:`build_tiny_video` behind a tower of :data:`QWEN2VL_2B_TOWER`'s
    shape, its merger's output the tiny model's width; frames resized to 84x84, so each pair
    takes 9 positions (36 a clip of 8 frames) and a clip costs the tower seconds on a CPU.
    About 2.6 GB, float32; building takes ~1 min.

    Raises:
        FileExistsError: ``path`` holds something else: another seed, or no marker.
    """
    recipe = {
        "kind": "qwen2vl-video",
        "seed": seed,
        "dtype": _DTYPE_NAME,
        **asdict(QWEN2VL_2B_TOWER),
    }
    return build_once(path, recipe, lambda tmp: _write_tiny_video(tmp, seed, QWEN2VL_2B_TOWER))


def _write_tiny_video(out: Path, seed: int, tower: VideoTower) -> None:
    """Tokenizer, image and video processors and seeded random model, saved as one folder."""
    import torch
    from transformers import (
        Qwen2VLConfig,
        Qwen2VLForConditionalGeneration,
        Qwen2VLProcessor,
        Qwen2VLVideoProcessor,
    )
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    tokenizer = train_tiny_tokenizer()
    specials = [VISION_START_TOKEN, VISION_END_TOKEN, IMAGE_PAD_TOKEN, VIDEO_TOKEN]
    tokenizer.add_tokens(specials, special_tokens=True)
    tokenizer.chat_template = VIDEO_CHAT_TEMPLATE
    token_ids = {token: tokenizer.convert_tokens_to_ids(token) for token in specials}

    heads = 4
    config = Qwen2VLConfig(
        text_config={
            "vocab_size": len(tokenizer),
            "hidden_size": _TEXT_HIDDEN_SIZE,
            "intermediate_size": 2 * _TEXT_HIDDEN_SIZE,
            "num_hidden_layers": 2,
            "num_attention_heads": heads,
            "num_key_value_heads": heads,
            "max_position_embeddings": 4096,
            # M-RoPE: the rotary half of each head (16 of 32) split over time, height, width
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 1_000_000.0,
                "mrope_section": [4, 6, 6],
            },
            "bos_token_id": tokenizer.bos_token_id,
            "eos_token_id": tokenizer.eos_token_id,
            "pad_token_id": tokenizer.pad_token_id,
        },
        vision_config={
            "depth": tower.depth,
            "embed_dim": tower.embed_dim,
            "hidden_size": _TEXT_HIDDEN_SIZE,  # the merger's output: the language model's width
            "num_heads": tower.num_heads,
            "mlp_ratio": tower.mlp_ratio,
            "patch_size": _PATCH_SIZE,
            "spatial_merge_size": _MERGE,
            "temporal_patch_size": 2,
        },
        image_token_id=token_ids[IMAGE_PAD_TOKEN],
        video_token_id=token_ids[VIDEO_TOKEN],
        vision_start_token_id=token_ids[VISION_START_TOKEN],
        vision_end_token_id=token_ids[VISION_END_TOKEN],
        tie_word_embeddings=False,
        dtype=_DTYPE_NAME,
    )
    # fork_rng: seed the weights without moving the caller's global random state.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2VLForConditionalGeneration(config)
        _scale_weights(model)
    model = model.to(getattr(torch, _DTYPE_NAME))
    model.save_pretrained(out)

    pixels = tower.frame_size * tower.frame_size
    processor = Qwen2VLProcessor(
        image_processor=Qwen2VLImageProcessorPil(min_pixels=pixels, max_pixels=pixels),
        # cap_pixels_per_frame False: transformers' current rule, said out loud (unset, it warns
        # that the default changes in 5.22; True would raise the per-frame bound past pixels)
        video_processor=Qwen2VLVideoProcessor(
            min_pixels=pixels, max_pixels=pixels, cap_pixels_per_frame=False
        ),
        tokenizer=tokenizer,
        chat_template=VIDEO_CHAT_TEMPLATE,
    )
    processor.save_pretrained(out)
    _check_saved(out, tower)


def _scale_weights(model: Any) -> None:
    """Unit-variance initialisation instead of transformers' 0.02, and wide logits: the tiny
    LLaVA's reasons (tiny_llava._scale_weights), with Qwen2-VL's 3-D patch embedding."""
    import torch
    from torch import nn

    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.Linear | nn.Conv3d):
                fan_in = module.weight[0].numel()
                module.weight.normal_(0.0, 1.0 / math.sqrt(fan_in))
                if module.bias is not None:
                    module.bias.normal_(0.0, 0.1)
            elif isinstance(module, nn.Embedding):
                module.weight.normal_(0.0, 1.0)
        head = model.get_output_embeddings()
        head.weight.normal_(0.0, _LOGIT_SCALE / math.sqrt(_TEXT_HIDDEN_SIZE))


def _check_saved(out: Path, tower: VideoTower) -> None:
    """Read back what vLLM reads, so that the marker is never written over a broken model: the
    config's family and token ids, the processor's tokens and template, and what a square
    frame pair and an image cost (``tower.pair_tokens`` positions each)."""
    import numpy as np
    from transformers import AutoConfig, AutoProcessor

    config = AutoConfig.from_pretrained(out)
    if config.model_type != "qwen2_vl":
        raise RuntimeError(f"{out}: saved as {config.model_type}, not qwen2_vl")
    processor = AutoProcessor.from_pretrained(out)
    if (processor.video_token, processor.image_token) != (VIDEO_TOKEN, IMAGE_PAD_TOKEN):
        raise RuntimeError(f"{out}: the saved processor lost its video or image token")
    if (processor.video_token_id, processor.image_token_id) != (
        config.video_token_id,
        config.image_token_id,
    ):
        raise RuntimeError(f"{out}: the tokenizer's vision tokens are not the model's")
    if not processor.tokenizer.chat_template:
        raise RuntimeError(f"{out}: the saved processor lost its chat template")
    side = tower.frame_size + 8  # resized down to frame_size
    prompt = _VIDEO_PART + _IMAGE_PART
    encoded = processor(
        text=[prompt],
        videos=[np.zeros((2, side, side, 3), dtype=np.uint8)],
        images=[np.zeros((side, side, 3), dtype=np.uint8)],
        return_tensors="np",
    )
    ids = encoded["input_ids"][0].tolist()
    counts = (ids.count(config.video_token_id), ids.count(config.image_token_id))
    expected = tower.pair_tokens
    if counts != (expected, expected):
        raise RuntimeError(
            f"{out}: a square frame pair and an image take {counts}, not {expected} each"
        )
