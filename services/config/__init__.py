"""mmgate's settings: environment variables ``MMGATE_*`` (nested with ``__``), CLI flags override.

    MMGATE_PORT=50052 MMGATE_ENGINE__MAX_MODEL_LEN=4096 mmgate serve --engine.dtype float16

Each field's docstring is its help text in ``mmgate serve --help`` and its row in the settings
tables of docs/service.md (``make settings-table``).

    engine.py          EngineSettings, SyntheticSettings, ThreadSettings, home_model_cache
    cache.py           CacheSettings (the actor's), MediaSettings, RedisSettings
    observability.py   TracingSettings, MetricsSettings, HealthSettings, LoadSettings
    access.py          AuthSettings, Grant, TenantSettings, TenantScheduling, ConnectionSettings
    chaos.py           ChaosSettings, FaultPlan, Faults
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from .access import (
    EVERY_TENANT,
    AuthSettings,
    ConnectionSettings,
    Grant,
    TenantScheduling,
    TenantSettings,
)
from .cache import CacheSettings, MediaSettings, RedisSettings
from .chaos import ChaosSettings, FaultPlan, Faults
from .engine import (
    ADAPTER_NAME,
    LORA_RANKS,
    EngineSettings,
    MiB,
    SyntheticSettings,
    ThreadSettings,
    home_model_cache,
)
from .observability import HealthSettings, LoadSettings, MetricsSettings, TracingSettings


class Settings(BaseSettings):
    """The server: where it listens, what one request may ask, how long it may run, and its logs."""

    model_config = SettingsConfigDict(
        env_prefix="MMGATE_",
        env_nested_delimiter="__",
        cli_prog_name="mmgate serve",
        cli_kebab_case=True,
        cli_implicit_flags=True,
        use_attribute_docstrings=True,
        extra="ignore",
    )

    host: str = "127.0.0.1"
    """Address to listen on."""
    port: int = Field(50051, ge=0, le=65535)
    """Port to listen on (0: any free port)."""
    replica: str = Field("", max_length=253)
    """This replica's name in Inference.GetServerInfo (empty: the host name, a pod's name on
    Kubernetes)."""
    # MMGATE_MODEL_CACHE reaches this field as any variable does, and nothing else reads it: the
    # default is the code's alone, the same on every machine (the docs print it)
    model_cache: Path = Field(default_factory=home_model_cache)
    """Where converted models live (MMGATE_MODEL_CACHE)."""

    @field_validator("model_cache", mode="before")
    @classmethod
    def _model_cache_as_written(cls, value: Any) -> Any:
        # as a shell means it: empty (a manifest's blank value) is the default, not the working
        # directory, and ~ the user's home, not a folder called "~"
        if value == "":
            return home_model_cache()
        return Path(value).expanduser() if isinstance(value, str | Path) else value

    engine: EngineSettings = Field(default_factory=EngineSettings)
    cache: CacheSettings = Field(default_factory=CacheSettings)
    media: MediaSettings = Field(default_factory=MediaSettings)
    tracing: TracingSettings = Field(default_factory=TracingSettings)
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)
    health: HealthSettings = Field(default_factory=HealthSettings)
    load: LoadSettings = Field(default_factory=LoadSettings)
    threads: ThreadSettings = Field(default_factory=ThreadSettings)
    chaos: ChaosSettings = Field(default_factory=ChaosSettings)
    redis: RedisSettings = Field(default_factory=RedisSettings)
    auth: AuthSettings = Field(default_factory=AuthSettings)
    tenants: TenantSettings = Field(default_factory=TenantSettings)
    connections: ConnectionSettings = Field(default_factory=ConnectionSettings)
    max_message_bytes: int = Field(32 * MiB, gt=0)
    """Largest request; up to twice this gets INVALID_ARGUMENT, beyond that gRPC refuses it."""
    max_prompt_chars: int = Field(200_000, gt=0)
    """Longest prompt, or all chat messages together, in characters."""
    max_chat_messages: int = Field(256, gt=0)
    """Most chat messages in one request."""
    max_stop_strings: int = Field(16, gt=0)
    """Most stop strings in one request."""
    max_stop_token_ids: int = Field(64, gt=0)
    """Most stop token ids in one request."""
    max_logit_bias: int = Field(300, gt=0)
    """Most logit_bias entries in one request (OpenAI's API allows 300)."""
    max_constraint_chars: int = Field(65_536, gt=0)
    """Longest output constraint (a JSON schema, regex or grammar, or all choices together), in
    characters: the engine compiles it into a grammar before the request's first token."""
    max_constraint_depth: int = Field(64, gt=0)
    """Deepest nesting in an output constraint: a JSON schema's objects and arrays with the
    groups of its patterns, a regex's groups, a grammar's brackets. The engine's compilers
    recurse once a level, natively: far deeper input overflows their stack and kills the
    process."""
    max_choices: int = Field(1024, gt=0)
    """Most strings in a request's choice constraint."""
    max_tools: int = Field(128, gt=0)
    """Most tools (functions) in one chat, as OpenAI's API allows."""
    max_tool_calls: int = Field(256, gt=0)
    """Most tool calls in a chat's assistant turns together (each is checked and rendered)."""
    max_tools_chars: int = Field(65_536, gt=0)
    """Longest tools of one chat (names, descriptions and parameters' schemas together), in
    characters: the template renders them into the prompt, and "required" or a named function
    compiles their schemas into a grammar."""
    max_samples: int = Field(8, gt=0)
    """Most samples a request may ask of one prompt (SamplingParams.n): each is a sequence in
    the engine, as a request of its own is."""
    default_max_tokens: int = Field(256, gt=0)
    """max_tokens of a request that sets none (less where the context window ends first)."""
    max_concurrent_requests: int = Field(256, gt=0)
    """Calls in progress (Generate, Complete, Prefetch) beyond this: RESOURCE_EXHAUSTED at once."""
    admin_reserve: int = Field(2, ge=0)
    """Of max_concurrent_requests, the calls only an admin may start: an operator is never
    locked out by tenants at their full shares (one call is always left to tenants)."""
    default_deadline_seconds: float = Field(300.0, gt=0)
    """Deadline of a call whose client set none: no request waits unbounded."""
    shutdown_grace_seconds: float = Field(10.0, ge=0)
    """On SIGTERM: how long requests in progress may finish before they are cancelled."""
    edges: int = Field(0, ge=0, le=64)
    """gRPC edge processes in front of this one (0: this process answers every call). The edges
    share the port and write the callers' streams, each on a core of its own; this process keeps
    the cache, the media stage and the engine, and sends each edge its streams' messages once
    an engine step (docs/architecture.md). Not with mtls or mesh auth: a caller's certificate
    and address stay at the edge."""
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    """Log level of mmgate's own loggers."""
    log_format: Literal["text", "json"] = "text"
    """text, or one JSON object a line; both carry the trace and span ids of the request."""

    @model_validator(mode="after")
    def _edges_see_no_peer(self) -> Settings:
        if self.edges and self.auth.mode in ("mtls", "mesh"):
            raise ValueError(
                f"edges: {self.auth.mode} auth reads the caller's connection, which stays at "
                "the edge; run without edges, or with token auth"
            )
        return self

    @property
    def max_send_bytes(self) -> int:
        """The largest message the server sends (twice max_message_bytes, as it receives): an
        answer of many samples with log-probabilities can come near it."""
        return 2 * self.max_message_bytes


def default_model_cache() -> Path:
    """Where converted models live, as the settings read it (MMGATE_MODEL_CACHE, else
    :func:`home_model_cache`): for code that holds no ``Settings`` (scripts, tests)."""
    return Settings().model_cache


__all__ = [
    "ADAPTER_NAME",
    "EVERY_TENANT",
    "LORA_RANKS",
    "AuthSettings",
    "CacheSettings",
    "ChaosSettings",
    "ConnectionSettings",
    "EngineSettings",
    "FaultPlan",
    "Faults",
    "Grant",
    "HealthSettings",
    "LoadSettings",
    "MediaSettings",
    "MetricsSettings",
    "MiB",
    "RedisSettings",
    "Settings",
    "SyntheticSettings",
    "TenantScheduling",
    "TenantSettings",
    "ThreadSettings",
    "TracingSettings",
    "default_model_cache",
    "home_model_cache",
]
