"""The engine's settings: the vLLM arguments operators tune, and where converted models live."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

MiB = 1024 * 1024
# what an adapter may be called: also what a metric label and a log line can hold
ADAPTER_NAME = r"^[A-Za-z0-9._-]{1,64}$"
# the ranks vLLM can serve (its max_lora_rank)
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def home_model_cache() -> Path:
    """``~/.cache/mmgate/models``, the default of ``Settings.model_cache``: outside the
    repository, so that a fresh clone or ``make clean`` does not redo the conversion."""
    return Path.home() / ".cache" / "mmgate" / "models"


class SyntheticSettings(BaseModel):
    """A synthetic engine in the place of the model, for load tests of the front end only: a
    GPU's continuous batching at next to no CPU (services/engine/synthetic.py). Every running
    request (max_num_seqs at once) gets a token each step, of a fixed text in the configured
    model's tokenizer; nothing the model would say."""

    model_config = ConfigDict(use_attribute_docstrings=True, frozen=True)

    step_seconds: float = Field(0.015, gt=0)
    """One decode step of the whole batch."""
    prefill_seconds_per_token: float = Field(0.00002, ge=0)
    """A request's prefill before its first token: this per prompt token."""
    answer_tokens: int = Field(128, gt=0)
    """Tokens before the end-of-sequence token (unless a request ignores it)."""
    answer: str = Field("", max_length=65_536)
    """Every request's answer in place of the built-in passage, its tokens then the
    end-of-sequence token (answer_tokens unused): a reasoning model's <think>...</think> or a
    tool call, to load-test the front end's reading of them; empty: the passage, each
    prompt's answer from a point of its own."""


class EngineSettings(BaseModel):
    """The vLLM engine arguments operators tune; anything else goes through ``extra``."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    model: str | None = None
    """Model folder or name; unset: the embedded SmolLM2-135M-Instruct, prepared on first start."""
    served_model_name: str | None = None
    """The name reported to clients; unset: the model folder's name."""
    dtype: str = "auto"
    """Weights and activations dtype; auto: on a CPU, bfloat16 where a known-answer check showed
    this CPU's bfloat16 kernels right, else float32 (services/engine/dtypes.py); on a GPU, the
    checkpoint's own."""
    max_model_len: int = Field(2048, gt=0)
    """Context window in tokens: prompt plus output."""
    max_num_seqs: int = Field(32, gt=0)
    """Sequences the engine runs at once."""
    queue: bool = True
    """Order requests for the engine in mmgate's queue (by tenant weight and priority) and hand
    it no more than it runs at once; false: every request goes to the engine at once, in order
    of arrival (docs/service.md, "Fair shares and priorities")."""
    max_logprob_alternatives: int | None = Field(256, gt=0)
    """Log-probability alternatives in the engine at once, at most: a run of n samples asking
    for k costs n x (k + 1) a step, each turned into text by vLLM on the event loop; a run
    beyond it waits in the queue (one run alone always goes) while other tenants' runs asking
    for none pass it. Unset: no bound (docs/reliability.md measures the loop's lag either way)."""
    queue_lead: int = Field(0, ge=0)
    """Sequences handed to the engine beyond max_num_seqs, so that it has the next ones at hand
    when a run ends; each is one that jumps mmgate's order."""
    block_size: int | None = Field(None, gt=0)
    """KV cache block size in tokens; unset: the platform's (128 on CPU)."""
    kv_cache_dtype: str = "auto"
    """KV cache dtype."""
    enable_prefix_caching: bool = True
    """Reuse KV blocks of shared prompt prefixes."""
    kv_cache_memory_bytes: int | None = Field(1024 * MiB, gt=0)
    """KV cache size; vLLM's CPU worker refuses to start without it."""
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    """On a GPU: the share of the device's memory that the engine and mmgate's vision encoder
    take together; the encoder's measured need is taken out of it, the rest is vLLM's
    gpu_memory_utilization (docs/images.md). Unused on the CPU."""
    tensor_parallel_size: int = Field(1, gt=0)
    """Devices one model is split over."""
    enforce_eager: bool = True
    """No graph compilation: on CPU, starts in ~17 s instead of 67-121 s for 20% less throughput
    (docs/benchmarks.md)."""
    seed: int = 0
    """The engine's random seed."""
    stream_interval: int = Field(1, gt=0)
    """Tokens per streamed message, at least (vLLM's stream_interval): the first token and the
    last delta go at once, the rest in groups of this many. 1: every engine step, as it comes;
    higher: fewer gRPC messages and less CPU a token (docs/benchmarks.md), coarser streaming. A
    request's SamplingParams.stream_interval can raise it, not lower it."""
    structured_output_backend: Literal["xgrammar", "guidance", "outlines", "auto"] = "xgrammar"
    """The backend that enforces a request's constraint (JSON schema, regex, grammar, choice).
    auto: vLLM's pick per request (xgrammar, else guidance or outlines for what xgrammar cannot
    take), but then JSON may hold any whitespace (compact_json must be false)."""
    compact_json: bool = True
    """JSON constrained output holds no whitespace between tokens (vLLM's
    disable_any_whitespace): a small model otherwise can spend its max_tokens on blank lines.
    Needs a named backend (xgrammar or guidance)."""
    unary_final_only: bool = True
    """A unary Complete that no other request can join asks the engine for its final output
    only, instead of an output at every step (false: every step, as a stream; for comparison)."""
    compile_hold_seconds: float = Field(60.0, gt=0)
    """A tenant hands the engine one output constraint's grammar at a time (the engine compiles
    them one by one, and goes on compiling one whose caller has left): how long a grammar left
    before its first token still counts as the tenant's, at most."""
    adapters: dict[str, Path] = Field(default_factory=dict)
    """LoRA adapters served from the start, as JSON: a name to a local folder holding
    adapter_config.json and adapter_model.safetensors, '{"support": "/adapters/support"}'.
    Tenants' grants say who may use which (docs/security.md)."""
    adapter_root: Path | None = None
    """The folder Inference.LoadAdapter may read adapters from (it and what is under it); unset:
    no adapters are loaded at run time."""
    max_adapters: int = Field(16, gt=0)
    """Adapters served at once, configured and loaded together; the engine keeps them all in
    memory."""
    max_loras: int | None = Field(None, gt=0)
    """Different adapters in one engine step (vLLM's max_loras); unset: the adapters configured
    at start, at least 1 and at most 8."""
    max_lora_rank: int | None = None
    """The highest rank an adapter may have (vLLM's max_lora_rank: 1, 8, 16, 32, 64, 128, 256,
    320 or 512); unset: the smallest of those that holds every adapter configured at start, and
    at least 16."""
    tool_template: Literal["auto", "model", "hermes"] = "auto"
    """How a chat's tools reach the prompt. model: the model's own chat template renders them;
    hermes: mmgate's ChatML template with Hermes-style <tool_call> tags (for ChatML models whose
    own template ignores tools, as SmolLM2-135M-Instruct's does); auto: the model's where its
    template takes tools, else hermes."""
    tool_parser: str = Field("hermes", pattern=r"^[a-z0-9_]{1,64}$")
    """vLLM's tool parser that reads a tool_choice "auto" answer's calls (vLLM's names:
    hermes, llama3_json, mistral, ...): the format the template asks the model to call in."""
    reasoning_parser: str = Field("", pattern=r"^[a-z0-9_]{0,64}$")
    """vLLM's reasoning parser that keeps a reasoning model's thinking apart from its answer
    (vLLM's names: deepseek_r1, qwen3, olmo3, ...): streamed and answered in fields of their
    own. Empty: none, the thinking is in the text as the model wrote it. Checked at start
    against the model's tokenizer."""
    extra: dict[str, Any] = Field(default_factory=dict)
    """Any other vLLM engine argument, as JSON: '{"swap_space": 2}'."""
    synthetic: SyntheticSettings | None = None
    """Load tests only: serve a synthetic engine that runs no model, its timing as JSON
    (step_seconds 0.015, prefill_seconds_per_token 0.00002, answer_tokens 128; '{}': these);
    unset: vLLM. docs/benchmarks.md, front-end capacity."""

    @property
    def lora(self) -> bool:
        """Whether the engine serves adapters at all (vLLM's enable_lora)."""
        return bool(self.adapters) or self.adapter_root is not None

    @model_validator(mode="after")
    def _adapters_named(self) -> EngineSettings:
        for name in self.adapters:
            if re.fullmatch(ADAPTER_NAME, name) is None:
                raise ValueError(f"adapter name {name[:64]!r}: letters, digits, '.', '-', '_'")
        if len(self.adapters) > self.max_adapters:
            raise ValueError(f"{len(self.adapters)} adapters configured, max_adapters is lower")
        if self.max_lora_rank is not None and self.max_lora_rank not in LORA_RANKS:
            raise ValueError(f"max_lora_rank must be one of {', '.join(map(str, LORA_RANKS))}")
        return self

    @model_validator(mode="after")
    def _compact_json_needs_a_backend(self) -> EngineSettings:
        if self.compact_json and self.structured_output_backend not in ("xgrammar", "guidance"):
            raise ValueError(
                "compact_json needs structured_output_backend xgrammar or guidance"
                f" (not {self.structured_output_backend}); set compact_json false to use it"
            )
        return self


class ThreadSettings(BaseModel):
    """Thread pools of CPU-bound work, one per kind: a burst in one queues there, not in others."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    hash: int = Field(2, gt=0)
    """Hashing large images (sha256 of the bytes)."""
    decode: int = Field(2, gt=0)
    """Decoding images."""
    encode: int = Field(1, gt=0)
    """Running the vision encoder (embeddings mode; torch uses several cores for each)."""
    encode_cpus: frozenset[Annotated[int, Field(ge=0)]] = frozenset()
    """The CPUs the encoders run on, as a JSON list (Linux; the torch threads an encode starts
    follow it), e.g. to keep a CPU host's towers off the event loop's core; empty: wherever the
    server runs."""
    render: int = Field(2, gt=0)
    """Rendering chat templates and tokenizing prompts."""


__all__ = [
    "ADAPTER_NAME",
    "LORA_RANKS",
    "EngineSettings",
    "MiB",
    "ThreadSettings",
    "home_model_cache",
]
