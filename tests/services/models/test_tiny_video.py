"""The tiny video model without an engine: its files, config, processor, template and build-once
behaviour (serving it is checked with vLLM in tests/services/pipeline/test_videos.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from services.cli.commands import main
from services.models import (
    MARKER_NAME,
    QWEN2VL_2B_TOWER,
    VIDEO_TOKEN,
    build_qwen2vl_video,
    build_tiny_video,
)
from services.models.tiny_video import (
    IMAGE_PAD_TOKEN,
    TINY_VIDEO_FRAME_SIZE,
    TINY_VIDEO_TOWER,
    VIDEO_CHAT_TEMPLATE,
    engine_settings,
)

EXPECTED_FILES = {
    MARKER_NAME,
    "chat_template.jinja",
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "processor_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
}


def _processor(path: Path) -> Any:
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(path)


def _config(path: Path) -> Any:
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(path)


def _leftovers(parent: Path) -> list[Path]:
    return [p for p in parent.iterdir() if ".tmp-" in p.name]


def test_tiny_video_is_a_complete_directory(tiny_video: Path) -> None:
    assert {p.name for p in tiny_video.iterdir()} >= EXPECTED_FILES
    assert _leftovers(tiny_video.parent) == []
    marker = json.loads((tiny_video / MARKER_NAME).read_text())
    assert (marker["kind"], marker["seed"], marker["dtype"]) == ("tiny-video", 0, "float32")
    modes = {p.stat().st_mode & 0o777 for p in tiny_video.iterdir()}
    assert len(modes) == 1  # the weights too: transformers writes them 0600


def test_its_config_fits_vllm_cpu(tiny_video: Path) -> None:
    config = _config(tiny_video)
    assert config.model_type == "qwen2_vl"
    text, vision = config.text_config, config.vision_config
    # vLLM's CPU attention has no kernel below a head size of 32
    assert text.hidden_size // text.num_attention_heads == 32
    assert vision.embed_dim // vision.num_heads == 32
    assert sum(text.rope_parameters["mrope_section"]) * 2 == 32
    assert vision.hidden_size == text.hidden_size  # the merger feeds the language model
    assert str(config.dtype).removeprefix("torch.") == "float32"
    tokenizer = _processor(tiny_video).tokenizer
    assert text.vocab_size == len(tokenizer)
    assert config.video_token_id == tokenizer.convert_tokens_to_ids(VIDEO_TOKEN)
    assert config.image_token_id == tokenizer.convert_tokens_to_ids(IMAGE_PAD_TOKEN)


def test_the_chat_template_marks_images_and_videos(tiny_video: Path) -> None:
    tokenizer = _processor(tiny_video).tokenizer
    assert tokenizer.chat_template == VIDEO_CHAT_TEMPLATE
    parts = [{"type": "image"}, {"type": "video"}, {"type": "text", "text": "What happens?"}]
    messages = [{"role": "user", "content": parts}]
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert prompt == (
        "<|im_start|>user\n"
        "<|vision_start|><|image_pad|><|vision_end|>"
        "<|vision_start|><|video_pad|><|vision_end|>What happens?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    # each vision token is one token, or the processor could not expand it
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    assert ids.count(tokenizer.convert_tokens_to_ids(VIDEO_TOKEN)) == 1


@pytest.mark.parametrize(
    ("frames", "height", "width", "positions"),
    [
        (2, 64, 64, 4),  # a square pair: 56x56, 4x4 patches merged 2x2
        (3, 64, 64, 8),  # an odd last frame is repeated into a pair
        (8, 56, 56, 16),
        (2, 64, 80, 2),  # another shape keeps its aspect: 28x56
    ],
)
def test_what_a_video_costs(
    tiny_video: Path, frames: int, height: int, width: int, positions: int
) -> None:
    processor = _processor(tiny_video)
    video = np.zeros((frames, height, width, 3), dtype=np.uint8)
    encoded = processor(text=["<|video_pad|>"], videos=[video], return_tensors="np")
    assert encoded["input_ids"][0].tolist().count(processor.video_token_id) == positions


def test_a_square_image_costs_four_positions(tiny_video: Path) -> None:
    processor = _processor(tiny_video)
    side = TINY_VIDEO_FRAME_SIZE
    image = np.zeros((side, side, 3), dtype=np.uint8)
    encoded = processor(text=["<|image_pad|>"], images=[image], return_tensors="np")
    assert encoded["input_ids"][0].tolist().count(processor.image_token_id) == 4


def test_the_weights_are_scaled_for_varied_greedy_tokens(tiny_video: Path) -> None:
    from safetensors.numpy import load_file

    weights = load_file(tiny_video / "model.safetensors")
    head = weights["lm_head.weight"]
    assert head.std() == pytest.approx(6.0 / math.sqrt(128), rel=0.1)
    linears = [w for name, w in weights.items() if name.endswith("mlp.fc1.weight")]
    assert linears
    for weight in linears:
        assert weight.std() == pytest.approx(1.0 / math.sqrt(weight.shape[1]), rel=0.2)


def test_the_cli_returns_the_built_folder_without_rebuilding(
    tiny_video: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = {p.name: p.stat().st_mtime_ns for p in tiny_video.iterdir()}
    assert main(["models", "tiny-video", str(tiny_video)]) == 0
    assert capsys.readouterr().out == f"{tiny_video}\n"
    assert {p.name: p.stat().st_mtime_ns for p in tiny_video.iterdir()} == before
    with pytest.raises(FileExistsError, match="another model"):
        build_tiny_video(tiny_video, seed=1)


def test_build_is_deterministic_per_seed(tiny_video: Path, tmp_path: Path) -> None:
    same = build_tiny_video(tmp_path / "same", seed=0)
    other = build_tiny_video(tmp_path / "other", seed=1)
    for name in EXPECTED_FILES - {"model.safetensors"}:
        assert (same / name).read_bytes() == (tiny_video / name).read_bytes(), name
    weights = (tiny_video / "model.safetensors").read_bytes()
    assert (same / "model.safetensors").read_bytes() == weights
    assert (other / "model.safetensors").read_bytes() != weights
    assert (other / "tokenizer.json").read_bytes() == (tiny_video / "tokenizer.json").read_bytes()


def test_engine_settings_serve_it_in_float32(tiny_video: Path) -> None:
    settings = engine_settings(tiny_video)
    assert settings["model"] == str(tiny_video)
    assert (settings["dtype"], settings["max_model_len"]) == ("float32", 1024)


def test_the_tiny_tower_is_what_the_config_says(tiny_video: Path) -> None:
    vision = _config(tiny_video).vision_config
    shape = (vision.depth, vision.embed_dim, vision.num_heads, vision.mlp_ratio)
    assert shape == (2, 64, 2, 2)
    assert (TINY_VIDEO_TOWER.frame_size, TINY_VIDEO_TOWER.pair_tokens) == (56, 4)


def test_the_big_tower_has_qwen2_vl_2b_shape() -> None:
    # Qwen/Qwen2-VL-2B-Instruct's vision_config: depth 32, embed_dim 1280, 16 heads, mlp_ratio 4;
    # 84x84 frames: 3x3 positions a pair after the 2x2 merge
    tower = QWEN2VL_2B_TOWER
    assert (tower.depth, tower.embed_dim, tower.num_heads, tower.mlp_ratio) == (32, 1280, 16, 4)
    assert (tower.frame_size, tower.pair_tokens) == (84, 9)


def test_the_big_model_is_not_built_over_the_tiny_one(tiny_video: Path) -> None:
    # the recipe differs (kind and tower), so build_once refuses before building 2.6 GB
    with pytest.raises(FileExistsError):
        build_qwen2vl_video(tiny_video)
