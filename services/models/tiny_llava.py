"""A tiny random-weight LLaVA for multimodal tests, built here from a config: no hub, no download.

    56x56 RGB ─▶ CLIP image processor ─▶ CLIP tower (3 layers, 4x4 patches of 14 px + CLS)
        ─▶ hidden state of layer 2 (vision_feature_layer -2), CLS dropped ("default")
        ─▶ projector (linear, GELU, linear) ─▶ 16 image embeddings of 128 ─▶ Llama (2 layers)

It is served by vLLM's ``LlavaForConditionalGeneration`` like any LLaVA-1.5 checkpoint, so the
multimodal paths (pixels, cached uuids, precomputed embeddings) run for real in seconds on a CPU.
The weights are random but scaled so that activations keep unit size and the logits are spread
wide: greedy decoding gives varied tokens, and a tie between two tokens is too rare for the last
bits of float32 rounding (pixels in vLLM vs embeddings from mmgate's encoder) to flip a choice.

float32, not bf16: vLLM's vision tower and mmgate's (transformers') are different kernels. In bf16
their rounding differs enough to flip a greedy token now and then; in float32 the answer from
embeddings is the answer from pixels (tests/services/engine/test_encoder.py holds it).

vLLM's LLaVA loader wants the tower's weights in the layout of the original checkpoints,
``vision_tower.vision_model.embeddings...``; transformers 5 saves ``vision_tower.embeddings...``,
so they are renamed after saving.

The image processor is built as the PIL one (``CLIPImageProcessorPil``, no torchvision needed),
but the saved files do not choose a backend: transformers 5 records it in
``processor_config.json`` as plain ``CLIPImageProcessor`` (it writes no
``preprocessor_config.json``, and ``use_fast`` is only a loading argument now), and the loader's
arguments decide. Where torchvision imports, ``AutoImageProcessor`` (and so vLLM) takes the
torchvision twin; the two agree to 2e-7 on 56x56 images and differ by up to 0.015 on images they
resize. mmgate's encoder loads the processor as vLLM does, so both always run the same one.

    mmgate models tiny-llava PATH [--seed N]

The same builder makes a LLaVA whose vision tower has the shape of CLIP ViT-L/14 at 336 px (24
layers, hidden 1024, 576 image tokens, ~300 M parameters, 1.2 GB in float32) on the same tiny
Llama: its encoder costs what a real LLaVA-1.5's does (seconds an image on two CPU cores), so the
benchmarks see what mmgate's encoder-output cache saves with a real tower (``build_vitl_llava``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

from ..wire import IMAGE_PLACEHOLDER
from .build import build_once
from .tiny import tiny_llama_config, train_tiny_tokenizer

__all__ = [
    "IMAGE_TOKEN",
    "LLAVA_CHAT_TEMPLATE",
    "TINY_LLAVA_IMAGE_SIZE",
    "VITL_TOWER",
    "Tower",
    "build_tiny_llava",
    "build_vitl_llava",
    "chatml_template",
    "engine_settings",
]

# LLaVA's own image token, spelled as mmgate's placeholder: the chat template puts it where
# each image part is
IMAGE_TOKEN: Final = IMAGE_PLACEHOLDER

TINY_LLAVA_IMAGE_SIZE: Final = 56
_PATCH_SIZE: Final = 14


@dataclass(frozen=True, slots=True)
class Tower:
    """The shape of a CLIP vision tower (14-pixel patches)."""

    image_size: int
    hidden_size: int
    intermediate_size: int
    layers: int
    heads: int

    @property
    def image_tokens(self) -> int:
        return (self.image_size // _PATCH_SIZE) ** 2


TINY_TOWER: Final = Tower(TINY_LLAVA_IMAGE_SIZE, 64, 128, 3, 2)
# openai/clip-vit-large-patch14-336, the tower of LLaVA-1.5
VITL_TOWER: Final = Tower(336, 1024, 4096, 24, 16)

_DTYPE_NAME: Final = "float32"

# Standard deviation of the logits over the vocabulary, for a unit-size final hidden state.
_LOGIT_SCALE: Final = 6.0


def chatml_template(media: dict[str, str]) -> str:
    """ChatML with OpenAI-style content parts: a message's content is a string, or a list of
    {"type": "text", "text": ...} parts and, for each kind in ``media`` ("image", "video"), its
    parts (also "image_url", "video_url", as OpenAI spells them), each rendered as the text
    ``media`` gives it (the model's own tokens for one)."""
    branches = "".join(
        f"{{% {'if' if i == 0 else 'elif'} part['type'] in ('{kind}', '{kind}_url') %}}"
        f"{{{{ '{text}' }}}}"
        for i, (kind, text) in enumerate(media.items())
    )
    return (
        "{% for message in messages %}"
        "{{ '<|im_start|>' + message['role'] + '\\n' }}"
        "{% if message['content'] is string %}"
        "{{ message['content'] }}"
        "{% else %}"
        "{% for part in message['content'] %}" + branches + "{% elif part['type'] == 'text' %}"
        "{{ part['text'] }}"
        "{% endif %}"
        "{% endfor %}"
        "{% endif %}"
        "{{ '<|im_end|>' + '\\n' }}"
        "{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    )


LLAVA_CHAT_TEMPLATE: Final = chatml_template({"image": IMAGE_TOKEN})


def engine_settings(path: Path, *, max_model_len: int = 512) -> dict[str, Any]:
    """How tests and benchmarks serve it (``Settings(engine=...)``): a small context and KV cache,
    and float32, in which mmgate's encoder and vLLM's agree token for token (see above)."""
    return {
        "model": str(path),
        "max_model_len": max_model_len,
        "kv_cache_memory_bytes": 128 * 1024 * 1024,
        "dtype": _DTYPE_NAME,
    }


def build_tiny_llava(path: Path, *, seed: int = 0) -> Path:
    """Build a tiny random-weight LLaVA at ``path`` (once) and return ``path``.

    CLIP tower: 3 layers, hidden 64, 2 heads, 56x56 input, 14-pixel patches (16 patches + CLS).
    Llama: 2 layers, hidden 128, 4 heads of 32, 2048 positions, the tokenizer of
    :func:`services.models.tiny.build_tiny_model` plus ``<image>``. Each image becomes 16 tokens.
    ``seed`` fixes the weights; the tokenizer is the same for every seed. About 2.8 MB, float32.

    Raises:
        FileExistsError: ``path`` holds something else: another seed, or no marker.
    """
    recipe = {"kind": "tiny-llava", "seed": seed, "dtype": _DTYPE_NAME}
    return build_once(path, recipe, lambda tmp: _write_tiny_llava(tmp, seed, TINY_TOWER))


def build_vitl_llava(path: Path, *, seed: int = 0) -> Path:
    """Build a random-weight LLaVA with a CLIP ViT-L/14-336-shaped tower at ``path`` (once).

    The tiny Llama of :func:`build_tiny_llava` behind a tower of :data:`VITL_TOWER`'s shape: each
    image becomes 576 tokens, and encoding one costs seconds on a CPU. Serve it with
    ``engine_settings(path, max_model_len=2048)``. About 1.2 GB; building takes ~30 s.
    """
    recipe = {"kind": "vitl-llava", "seed": seed, "dtype": _DTYPE_NAME, **asdict(VITL_TOWER)}
    return build_once(path, recipe, lambda tmp: _write_tiny_llava(tmp, seed, VITL_TOWER))


def _write_tiny_llava(out: Path, seed: int, tower: Tower) -> None:
    """Tokenizer, image processor and seeded random model, saved as one LLaVA directory."""
    import torch
    from transformers import (
        CLIPImageProcessorPil,
        CLIPVisionConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
    )

    tokenizer = train_tiny_tokenizer()
    tokenizer.add_tokens([IMAGE_TOKEN], special_tokens=True)
    tokenizer.chat_template = LLAVA_CHAT_TEMPLATE
    image_token_id = tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)

    vision_config = CLIPVisionConfig(
        hidden_size=tower.hidden_size,
        intermediate_size=tower.intermediate_size,
        num_hidden_layers=tower.layers,
        num_attention_heads=tower.heads,
        image_size=tower.image_size,
        patch_size=_PATCH_SIZE,
        projection_dim=tower.hidden_size,
    )
    text_config = tiny_llama_config(tokenizer, hidden_size=128, heads=4)
    config = LlavaConfig(
        vision_config=vision_config,
        text_config=text_config,
        image_token_id=image_token_id,
        projector_hidden_act="gelu",
        # the second-to-last layer without CLS, as in LLaVA-1.5: exercises both settings
        vision_feature_layer=-2,
        vision_feature_select_strategy="default",
        image_seq_length=tower.image_tokens,
        dtype=_DTYPE_NAME,
    )
    # fork_rng: seed the weights without moving the caller's global random state.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlavaForConditionalGeneration(config)
        _scale_weights(model, text_config.hidden_size)
    model = model.to(getattr(torch, _DTYPE_NAME))
    model.save_pretrained(out)
    _rename_vision_tower_weights(out / "model.safetensors")

    image_processor = CLIPImageProcessorPil(
        size={"shortest_edge": tower.image_size},
        crop_size={"height": tower.image_size, "width": tower.image_size},
    )
    processor = LlavaProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=_PATCH_SIZE,
        vision_feature_select_strategy=config.vision_feature_select_strategy,
        chat_template=LLAVA_CHAT_TEMPLATE,
        image_token=IMAGE_TOKEN,
        num_additional_image_tokens=1,  # CLS
    )
    processor.save_pretrained(out)
    _check_saved(out)


def _scale_weights(model: Any, text_hidden_size: int) -> None:
    """Unit-variance initialisation instead of transformers' 0.02, and wide logits.

    With std 0.02 every layer is close to the identity and all logits sit within a few hundredths
    of each other: greedy output repeats one token, and the smallest numerical difference between
    two implementations can flip it. Here each linear map keeps its input's size (std 1/sqrt(fan
    in)), embeddings are unit size, and the output head spreads logits by ``_LOGIT_SCALE``.
    """
    import torch
    from torch import nn

    with torch.no_grad():
        for name, module in model.named_modules():
            if isinstance(module, nn.Linear | nn.Conv2d):
                fan_in = module.weight[0].numel()
                module.weight.normal_(0.0, 1.0 / math.sqrt(fan_in))
                if module.bias is not None:
                    module.bias.normal_(0.0, 0.1)
            elif isinstance(module, nn.Embedding):
                module.weight.normal_(0.0, 1.0)
            if name.endswith("embeddings") and hasattr(module, "class_embedding"):
                module.class_embedding.normal_(0.0, 1.0)
        head = model.get_output_embeddings()
        head.weight.normal_(0.0, _LOGIT_SCALE / math.sqrt(text_hidden_size))


def _rename_vision_tower_weights(weights: Path) -> None:
    """``vision_tower.X`` to ``vision_tower.vision_model.X``, the layout vLLM's loader expects."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(weights)
    renamed = {}
    for name, tensor in tensors.items():
        if name.startswith("vision_tower.") and not name.startswith("vision_tower.vision_model."):
            name = "vision_tower.vision_model." + name.removeprefix("vision_tower.")
        renamed[name] = tensor
    save_file(renamed, weights, metadata={"format": "pt"})


def _check_saved(out: Path) -> None:
    """Read back what vLLM reads, so that the marker is never written over a broken model."""
    from transformers import AutoConfig, AutoProcessor

    config = AutoConfig.from_pretrained(out)
    if config.model_type != "llava":
        raise RuntimeError(f"{out}: saved as {config.model_type}, not llava")
    processor = AutoProcessor.from_pretrained(out)
    if processor.image_token != IMAGE_TOKEN or not processor.tokenizer.chat_template:
        raise RuntimeError(f"{out}: the saved processor lost its image token or chat template")
    if processor.image_token_id != config.image_token_id:
        raise RuntimeError(f"{out}: the tokenizer's {IMAGE_TOKEN} is not the model's image token")
