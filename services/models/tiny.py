"""A tiny random-weight Llama for tests that need a real engine but not real answers.

It loads and starts in seconds and needs nothing from outside: two layers, hidden size 64, and a
byte-level BPE vocabulary trained here on generated text, so that any string tokenizes and
decodes back. Its greedy output is gibberish, but deterministic.

    mmgate models tiny PATH [--seed N]
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

from .build import build_once
from .default import CHATML_TEMPLATE

__all__ = ["build_tiny_model", "train_tiny_tokenizer"]

# The tiny model's special tokens, at the ids SmolLM2 gives them (0, 1, 2).
_PAD: Final = "<|endoftext|>"
_BOS: Final = "<|im_start|>"
_EOS: Final = "<|im_end|>"

_TINY_VOCAB_SIZE: Final = 768
_DTYPE_NAME: Final = "bfloat16"


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
    return build_once(path, recipe, lambda tmp: _write_tiny_model(tmp, seed))


def tiny_llama_config(tokenizer: Any, *, hidden_size: int, heads: int) -> Any:
    """A two-layer Llama over ``tokenizer``'s vocabulary, heads of 32 (vLLM's CPU attention
    needs at least that), 2048 positions: the language model of every tiny test model."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=2,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        head_dim=32,
        max_position_embeddings=2048,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )


def _write_tiny_model(out: Path, seed: int) -> None:
    """Train the tokenizer, make the seeded random model, and save both at ``out``."""
    import torch
    from transformers import LlamaForCausalLM

    tokenizer = train_tiny_tokenizer()
    config = tiny_llama_config(tokenizer, hidden_size=64, heads=2)
    # fork_rng: seed the weights without moving the caller's global random state.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model = model.to(getattr(torch, _DTYPE_NAME))
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def train_tiny_tokenizer() -> Any:
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
