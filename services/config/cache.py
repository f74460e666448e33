"""The cache's settings: the actor's budget and deadlines, images, and Redis as its second tier."""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from cache_actor import CacheConfig, Journal

from .engine import MiB

# the cache actor's own defaults are the settings' (one source): a setting the actor or its
# journal also takes reads its default from there (tenants' max_labels too: access.py)
ACTOR_DEFAULTS: Final = CacheConfig()
UrlScheme = Literal["https", "http"]


def _https_only() -> list[UrlScheme]:
    return ["https"]


# a host name as an allow-list entry: labels of letters, digits and hyphens
_HOST = re.compile(r"(?i)[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*")
# the settings the actor takes under the same name
_BY_NAME = (
    "max_bytes",
    "ttl_seconds",
    "mailbox_size",
    "compute_deadline",
    "stall_threshold",
    "max_entry_fraction",
)


class CacheSettings(BaseModel):
    """The cache actor's budget and deadlines (see docs/cache_actor.md)."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    max_bytes: int = Field(ACTOR_DEFAULTS.max_bytes, gt=0)
    """Byte budget of the in-memory cache."""
    max_bytes_per_tenant: int | None = Field(None, gt=0)
    """One tenant's budget; unset: with more than one tenant configured, an equal share of
    max_bytes, else all of it."""
    ttl_seconds: float | None = Field(ACTOR_DEFAULTS.ttl_seconds, gt=0)
    """Drop entries older than this (memory hygiene)."""
    mailbox_size: int = Field(ACTOR_DEFAULTS.mailbox_size, gt=0)
    """Queued lookups before the cache refuses with RESOURCE_EXHAUSTED."""
    compute_deadline: float = Field(ACTOR_DEFAULTS.compute_deadline, gt=0)
    """A cache computation (tokenizing, decoding) is cancelled after this many seconds."""
    stall_threshold: float = Field(ACTOR_DEFAULTS.stall_threshold, gt=0)
    """A computation older than this many seconds is logged with its stack."""
    on_failure: Literal["compute", "fail"] = "compute"
    """When the cache actor cannot answer (dead, or stalled past the health monitor's ping):
    "compute": each request computes what it needs itself, uncached and uncoalesced, and a dead
    actor is replaced by an empty one (at most 3 times in 10 minutes); "fail": requests get
    UNAVAILABLE and liveness fails (docs/cache_actor.md)."""
    max_watchers: int = Field(Journal.DEFAULT_MAX_WATCHERS, gt=0)
    """Cache.Watch streams open at once; one more is refused with RESOURCE_EXHAUSTED."""
    max_watchers_per_tenant: int = Field(4, gt=0)
    """Cache.Watch streams one tenant may have open at once, within max_watchers (an admin's
    count as its own tenant's, whatever they watch); one more is refused with
    RESOURCE_EXHAUSTED."""
    watch_idle_seconds: float = Field(30.0, gt=0)
    """A watcher whose client has taken nothing for this long while an event waits to be sent
    to it (it stopped reading: HTTP/2 flow control holds the write) is ended, its slot given
    back: its stream ends, after what it was sent, with RESOURCE_EXHAUSTED, and it resumes from
    the last sequence number it saw."""
    watch_buffer: int = Field(256, gt=0)
    """Events held for a watcher that has not read them; one more and it gets a "gap" event
    and its stream ends (it resumes from its last sequence number, or from a snapshot)."""
    watch_history: int = Field(Journal.DEFAULT_HISTORY, gt=0)
    """Recent events kept, so that a watcher can resume from the last sequence number it saw."""
    max_entry_fraction: float = Field(ACTOR_DEFAULTS.max_entry_fraction, gt=0, le=1)
    """A value larger than this share of a tenant's budget is served but not stored (one request
    must not flush everyone's images): 25.6 MiB of the default 512 MiB."""

    def actor_config(
        self,
        redis: RedisSettings | None = None,
        *,
        tenant_bytes: int | None = None,
        max_tenants: int,
    ) -> CacheConfig:
        """The actor's settings; with ``redis``, its second tier's bounds too. ``tenant_bytes``:
        one tenant's budget where it is not set here (a fair share: api/quotas.py);
        ``max_tenants``: the tenants whose counts are kept (``TenantSettings.max_labels``)."""
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
            **{name: getattr(self, name) for name in _BY_NAME},
            max_bytes_per_tenant=self.max_bytes_per_tenant or tenant_bytes,
            max_tenants=max_tenants,
        )


class MediaSettings(BaseModel):
    """Images: how they are cached and what is accepted (see docs/images.md)."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    mode: Literal["auto", "embeddings", "pixels"] = "auto"
    """auto: cache encoder outputs where mmgate can run the model's vision encoder (LLaVA family)
    and it takes at least auto_min_encode_ms an image, else cache decoded images and let the
    engine encode them."""
    auto_min_encode_ms: float = Field(5.0, ge=0)
    """auto: the encoder time per image (measured at start, on the engine's device) below which
    mmgate leaves encoding to the engine: a tower that fast saves less on a repeat than handing
    its output over costs on every new image (docs/images.md)."""
    encode_batch: int = Field(8, gt=0)
    """Most images in one run of the vision encoder: encodes of different images that wait at
    the same time run together (embeddings mode)."""
    encode_window_ms: float = Field(0.0, ge=0, le=1000)
    """How long a batch waits for more images once it could run; 0: it takes what waits, so a
    lone image never waits (images still batch while the encoder is busy)."""
    max_images_per_request: int = Field(16, gt=0)
    """Most images in one request."""
    max_image_bytes: int = Field(10 * MiB, gt=0)
    """Largest encoded image."""
    max_image_pixels: int = Field(40_000_000, gt=0)
    """Most pixels (width x height) of one image, checked before it is decoded."""
    url_schemes: list[UrlScheme] = Field(default_factory=_https_only)
    """Schemes an image URL may have (Image.url); http only where the network path is trusted."""
    url_allow: list[str] = Field(default_factory=list)
    """Hosts and CIDRs an image URL may reach although they are loopback, private, link-local
    (the cloud metadata address), multicast, unspecified or reserved (docs/security.md)."""

    @field_validator("url_allow")
    @classmethod
    def _hosts_and_networks(cls, entries: list[str]) -> list[str]:
        for entry in entries:
            try:
                ipaddress.ip_network(entry, strict=False)
            except ValueError:
                if not _HOST.fullmatch(entry):
                    raise ValueError(f"{entry!r} is neither a host name nor a CIDR") from None
        return [entry.lower() for entry in entries]

    url_max_redirects: int = Field(3, ge=0, le=10)
    """Redirects followed for an image URL, each hop checked as the first."""
    url_connect_timeout_seconds: float = Field(5.0, gt=0)
    """Connecting to an image URL's host, within the request's deadline."""
    url_read_timeout_seconds: float = Field(10.0, gt=0)
    """Longest wait for the next bytes of an image URL's answer, within the request's deadline."""
    url_fresh_seconds: float = Field(60.0, ge=0)
    """How long a fetched URL's bytes are used again (per tenant) before it is fetched anew."""
    url_ca_file: Path | None = None
    """PEM of the CAs image URLs' servers are checked against; unset: the system's."""
    min_image_side: int = Field(8, gt=0)
    """Smallest width or height in pixels."""
    encoder_dtype: str | None = None
    """The vision encoder's dtype (embeddings mode); unset: the engine's."""
    shrink_images: bool = True
    """Store decoded images at the size the model's image processor resizes them to, where that
    leaves its output unchanged (fixed-resolution processors; checked at start)."""
    video_mode: Literal["auto", "embeddings", "pixels"] = "auto"
    """Clips: cache the vision tower's output for a clip where mmgate can run it (Qwen2-VL) and,
    in auto, a clip's encode takes at least auto_min_encode_ms a frame; else cache the sampled
    frames and let the engine encode them (docs/video.md)."""
    max_videos_per_request: int = Field(2, gt=0)
    """Most videos in one request (a model that takes video)."""
    max_video_bytes: int = Field(64 * MiB, gt=0)
    """Largest clip, as sent or fetched."""
    max_video_seconds: float = Field(600.0, gt=0)
    """Longest clip, by the frame count and rate its header states, checked before decoding."""
    max_video_frames: int = Field(32, gt=0, le=1024)
    """Most frames sampled from one clip (Video.num_frames' default and ceiling; vLLM's own
    default is 32)."""
    max_video_frame_pixels: int = Field(1920 * 1080, gt=0)
    """Most pixels (width x height) of one frame, from the clip's header, before decoding."""
    video_decode_seconds: float = Field(20.0, gt=0)
    """Longest a clip's decode may take; past it the clip is refused and the decode stops."""


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
    timeout_seconds: float = Field(ACTOR_DEFAULTS.tier_timeout, gt=0)
    """Bound on every Redis call, a value's check and decode included; beyond it, a miss."""
    embedding_ttl_seconds: float = Field(7 * 24 * 3600.0, gt=0)
    """How long an encoder output (an image's or a clip's) stays in Redis."""
    response_ttl_seconds: float = Field(24 * 3600.0, gt=0)
    """How long a finished shared response stays in Redis."""
    video_ttl_seconds: float = Field(24 * 3600.0, gt=0)
    """How long a clip's sampled frames stay in Redis."""
    max_value_bytes: int = Field(32 * MiB, gt=0)
    """A larger value is not written (and one read back is refused)."""
    write_queue: int = Field(ACTOR_DEFAULTS.tier_write_queue, gt=0)
    """Writes waiting for Redis; beyond this they are dropped, counted."""
    breaker_failures: int = Field(ACTOR_DEFAULTS.tier_breaker_failures, gt=0)
    """Consecutive failed reads that open the circuit breaker."""
    breaker_seconds: float = Field(ACTOR_DEFAULTS.tier_breaker_seconds, ge=0)
    """How long an open breaker stops asking Redis."""
    value_secret_file: Path | None = None
    """A file holding a secret shared by the replicas: each value then carries an HMAC-SHA256 of
    its key and bytes, so that only a holder of the secret can write a value mmgate will read;
    unset: values are bound to their key by a checked header alone."""


__all__ = ["ACTOR_DEFAULTS", "CacheSettings", "MediaSettings", "RedisSettings"]
