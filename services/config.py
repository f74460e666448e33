"""mmgate's settings: environment variables ``MMGATE_*`` (nested with ``__``), CLI flags override.

MMGATE_PORT=50052 MMGATE_ENGINE__MAX_MODEL_LEN=4096 mmgate serve --engine.dtype bfloat16
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from cache_actor import CacheConfig

from .models import default_model_cache

MiB = 1024 * 1024


class EngineSettings(BaseModel):
    """The vLLM engine arguments operators tune; anything else goes through ``extra``."""

    # None: the embedded default model (SmolLM2-135M-Instruct), prepared on first start.
    model: str | None = None
    served_model_name: str | None = None
    dtype: str = "bfloat16"
    max_model_len: int = Field(2048, gt=0)
    max_num_seqs: int = Field(32, gt=0)
    # None: the platform's default (128 tokens on CPU).
    block_size: int | None = Field(None, gt=0)
    kv_cache_dtype: str = "auto"
    enable_prefix_caching: bool = True
    # Set explicitly: vLLM's CPU worker refuses to guess it from this machine's NUMA report.
    kv_cache_memory_bytes: int | None = Field(1024 * MiB, gt=0)
    tensor_parallel_size: int = Field(1, gt=0)
    # Eager start is ~7 s against ~50 s of compilation redone on every start (docs/engine.md).
    enforce_eager: bool = True
    seed: int = 0
    # Any other AsyncEngineArgs field, passed through as is: '{"swap_space": 2}'.
    extra: dict[str, Any] = Field(default_factory=dict)


class CacheSettings(BaseModel):
    """The cache actor's budget and deadlines (see docs/cache_actor.md)."""

    max_bytes: int = Field(512 * MiB, gt=0)
    max_bytes_per_tenant: int | None = Field(None, gt=0)
    ttl_seconds: float | None = Field(None, gt=0)
    mailbox_size: int = Field(4096, gt=0)
    compute_deadline: float = Field(60.0, gt=0)
    stall_threshold: float = Field(10.0, gt=0)

    def actor_config(self) -> CacheConfig:
        return CacheConfig(
            max_bytes=self.max_bytes,
            max_bytes_per_tenant=self.max_bytes_per_tenant,
            ttl_seconds=self.ttl_seconds,
            mailbox_size=self.mailbox_size,
            compute_deadline=self.compute_deadline,
            stall_threshold=self.stall_threshold,
        )


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="MMGATE_",
        env_nested_delimiter="__",
        cli_prog_name="mmgate serve",
        cli_kebab_case=True,
        cli_implicit_flags=True,
        extra="ignore",
    )

    host: str = "127.0.0.1"
    port: int = Field(50051, ge=0, le=65535)
    # Where `mmgate models prepare` puts converted models (MMGATE_MODEL_CACHE).
    model_cache: Path = Field(default_factory=default_model_cache)
    engine: EngineSettings = Field(default_factory=EngineSettings)
    cache: CacheSettings = Field(default_factory=CacheSettings)
    # Requests: what is refused before the engine sees it.
    max_message_bytes: int = Field(4 * MiB, gt=0)
    max_prompt_chars: int = Field(200_000, gt=0)
    max_chat_messages: int = Field(256, gt=0)
    max_stop_strings: int = Field(16, gt=0)
    # max_tokens of a request that sets none (less where the context window ends first).
    default_max_tokens: int = Field(256, gt=0)
    # Streams in progress beyond this get RESOURCE_EXHAUSTED at once.
    max_concurrent_requests: int = Field(256, gt=0)
    # The deadline of a call whose client set none: no request waits unbounded.
    default_deadline_seconds: float = Field(300.0, gt=0)
    # On SIGTERM: how long in-flight streams may finish before they are cancelled.
    shutdown_grace_seconds: float = Field(10.0, ge=0)
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
