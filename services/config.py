"""mmgate's settings: environment variables ``MMGATE_*`` (nested with ``__``), CLI flags override.

    MMGATE_PORT=50052 MMGATE_ENGINE__MAX_MODEL_LEN=4096 mmgate serve --engine.dtype float16

Each field's docstring is its help text in ``mmgate serve --help``.
"""

from __future__ import annotations

import os
from ipaddress import IPv4Network, IPv6Network
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, IPvAnyNetwork, model_validator
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
    """Weights and activations dtype; auto: on a CPU, bfloat16 where a known-answer check showed
    this CPU's bfloat16 kernels right, else float32 (services/engine/dtypes.py); on a GPU, the
    checkpoint's own."""
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
    stream_interval: int = Field(1, gt=0)
    """Tokens per streamed message, at least (vLLM's stream_interval): the first token and the
    last delta go at once, the rest in groups of this many. 1: every engine step, as it comes;
    higher: fewer gRPC messages and less CPU a token (docs/benchmarks.md), coarser streaming. A
    request's SamplingParams.stream_interval can raise it, not lower it."""
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

    def actor_config(
        self,
        redis: RedisSettings | None = None,
        *,
        tenant_bytes: int | None = None,
        max_tenants: int = 1024,
    ) -> CacheConfig:
        """The actor's settings; with ``redis``, its second tier's bounds too. ``tenant_bytes``:
        one tenant's budget where it is not set here (a fair share: api/quotas.py)."""
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
            max_bytes_per_tenant=self.max_bytes_per_tenant or tenant_bytes,
            max_tenants=max_tenants,
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
    value_secret_file: Path | None = None
    """A file holding a secret shared by the replicas: each value then carries an HMAC-SHA256 of
    its key and bytes, so that only a holder of the secret can write a value mmgate will read;
    unset: values are bound to their key by a checked header alone."""


class Grant(BaseModel):
    """What one credential is: the tenant it acts as, and its role."""

    model_config = ConfigDict(use_attribute_docstrings=True, extra="forbid", frozen=True)

    tenant: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    """The tenant whose cache entries the caller sees (letters, digits, - and _)."""
    role: Literal["tenant", "admin"] = "tenant"
    """admin: sees every tenant's stats and may inspect or invalidate any tenant's entries."""

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, value: Any) -> Any:
        # "a-tenant" for {"tenant": "a-tenant"}: the common case of a plain mapping
        return {"tenant": value} if isinstance(value, str) else value


def _istio_sidecar() -> list[IPv4Network | IPv6Network]:
    """Where Istio's sidecar connects from in its default REDIRECT mode."""
    return [IPv4Network("127.0.0.6/32"), IPv6Network("::6/128")]


class AuthSettings(BaseModel):
    """Who a caller is (see docs/security.md): the tenant every cache entry of theirs belongs to."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    mode: Literal["none", "token", "mtls", "mesh"] = "none"
    """none: the x-mmgate-tenant header is a label, not a boundary (loopback development);
    token: bearer tokens; mtls: client certificates; mesh: the sidecar's x-forwarded-client-cert."""
    tokens_file: Path | None = None
    """token mode: a JSON object of token SHA-256 hex digests to grants, {"<sha256>": "tenant"}
    or {"<sha256>": {"tenant": "ops", "role": "admin"}}; reloaded on change and on SIGHUP."""
    tokens: dict[str, Grant] = Field(default_factory=dict)
    """token mode: grants by token SHA-256 hex digest, as in tokens_file, from the environment."""
    reload_seconds: float = Field(2.0, gt=0)
    """How often the tokens file is checked for a change (a Kubernetes Secret update sends no
    signal)."""
    tls_cert_file: Path | None = None
    """The server's certificate chain (PEM): serve TLS (required in mtls mode)."""
    tls_key_file: Path | None = None
    """The server's private key (PEM)."""
    client_ca_file: Path | None = None
    """mtls mode: the CA bundle client certificates must chain to."""
    tokens_missing_grace_seconds: float = Field(30.0, ge=0)
    """token mode: how long the tokens file may be missing (a Secret update swaps a symlink)
    before every token is refused; service resumes when the file returns."""
    identities: dict[str, Grant] = Field(default_factory=dict)
    """mtls and mesh modes: grants by identity: a client certificate's URI SAN, DNS SAN or CN
    (mtls), the caller's SPIFFE URI from x-forwarded-client-cert (mesh)."""
    sidecar_peers: list[IPvAnyNetwork] = Field(default_factory=_istio_sidecar)
    """mesh mode: the addresses (or CIDRs) the sidecar connects from; x-forwarded-client-cert
    from any other peer is refused. Istio's REDIRECT mode: 127.0.0.6 and ::6 (the default); in
    TPROXY mode the caller's own address shows: list the pod CIDR there (docs/security.md)."""
    sidecar_xfcc: Literal["append_forward", "sanitize_set"] = "append_forward"
    """mesh mode: how the sidecar writes x-forwarded-client-cert (Envoy's
    forward_client_cert_details): append_forward (Istio's sidecar default) believes the last
    element; sanitize_set refuses any header holding more than the sidecar's own element."""
    protect_health: bool = False
    """Ask health checks for credentials too (kubelet's gRPC probes send none)."""
    protect_reflection: bool = False
    """Ask reflection for credentials too."""

    @model_validator(mode="after")
    def _complete(self) -> AuthSettings:
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("tls_cert_file and tls_key_file go together")
        if self.mode == "mtls" and (self.tls_cert_file is None or self.client_ca_file is None):
            raise ValueError("mtls mode needs tls_cert_file, tls_key_file and client_ca_file")
        if self.mode == "token" and self.tokens_file is None and not self.tokens:
            raise ValueError("token mode needs tokens_file or tokens")
        if self.mode in ("mtls", "mesh") and not self.identities:
            raise ValueError(f"{self.mode} mode needs identities (who is which tenant)")
        return self

    def tenants(self) -> frozenset[str]:
        """The tenants the configuration names (a tokens file may name more once loaded)."""
        grants = [*self.tokens.values(), *self.identities.values()]
        return frozenset(g.tenant for g in grants if g.role == "tenant")


class ConnectionSettings(BaseModel):
    """HTTP/2 connections: the pings mmgate tolerates and sends, and how long a connection lives
    (see docs/service.md, "Connections")."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    min_ping_interval_seconds: float = Field(0.5, gt=0)
    """A client's pings closer together than this (while mmgate sends nothing) are strikes."""
    max_ping_strikes: int = Field(3, ge=0)
    """Strikes before the connection is closed with GOAWAY too_many_pings (0: never)."""
    permit_pings_without_calls: bool = True
    """Accept keepalive pings on a connection with no call in flight (an idle pooled channel)."""
    keepalive_seconds: float = Field(60.0, gt=0)
    """mmgate pings a connection quiet for this long, to find peers that have gone."""
    keepalive_timeout_seconds: float = Field(20.0, gt=0)
    """A ping unanswered for this long closes the connection."""
    max_age_seconds: float | None = Field(None, gt=0)
    """Close connections older than this (GOAWAY; calls in flight go on for the grace period),
    so clients of a plain Kubernetes Service reconnect and reach new replicas; unset: never
    (a mesh balances per request)."""
    max_age_grace_seconds: float = Field(600.0, gt=0)
    """How long calls on an aged connection may still run: longer than the longest stream."""


class TenantSettings(BaseModel):
    """What tenants share and how much each may use (see docs/security.md)."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    share_media: bool = False
    """Decoded images and encoder outputs shared by every tenant (one organisation's replicas):
    a tenant then learns from a hit that another sent that image."""
    share_prefix: bool = False
    """The engine's prefix cache shared by every tenant (a common system prompt): a tenant then
    learns from cached_prompt_tokens that another sent that prefix."""
    max_concurrent_requests: int | None = Field(None, gt=0)
    """One tenant's requests in progress; unset: with more than one tenant configured, an equal
    share of max_concurrent_requests, else all of it."""
    max_labels: int = Field(1024, gt=0)
    """Tenants whose counters are kept; beyond it the longest idle are forgotten (in mode none
    any caller can name a new tenant)."""


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
