"""Who calls and how: authentication, tenants, and the HTTP/2 connections they arrive on."""

from __future__ import annotations

import re
from ipaddress import IPv4Network, IPv6Network
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, IPvAnyNetwork, model_validator

from .cache import ACTOR_DEFAULTS

TENANT_NAME = r"^[A-Za-z0-9_-]{1,64}$"
_TENANT = re.compile(TENANT_NAME[1:-1])


class Grant(BaseModel):
    """What one credential is: the tenant it acts as, and its role."""

    model_config = ConfigDict(use_attribute_docstrings=True, extra="forbid", frozen=True)

    tenant: str = Field(pattern=TENANT_NAME)
    """The tenant whose cache entries the caller sees (letters, digits, - and _)."""
    role: Literal["tenant", "admin"] = "tenant"
    """admin: sees every tenant's stats and may inspect or invalidate any tenant's entries."""
    adapters: tuple[str, ...] = ()
    """The LoRA adapters the tenant may name in its requests ("*": every one served); an admin
    may use every one."""
    default_adapter: str | None = None
    """The adapter a request that names none is answered through; unset: the base model."""

    @model_validator(mode="after")
    def _default_is_allowed(self) -> Grant:
        default = self.default_adapter
        if default is not None and "*" not in self.adapters and default not in self.adapters:
            raise ValueError(f"default_adapter {default[:64]!r} is not among its adapters")
        return self

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
    """The server's certificate chain (PEM): serve TLS (required in mtls mode); unset: plaintext."""
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
    """A ping unanswered for this long closes the connection: a client that vanished without a
    FIN frees its calls."""
    max_age_seconds: float | None = Field(None, gt=0)
    """Close connections older than this (GOAWAY; calls in flight go on for the grace period),
    so clients of a plain Kubernetes Service reconnect and reach new replicas; unset: never
    (a mesh balances per request)."""
    max_age_grace_seconds: float = Field(600.0, gt=0)
    """How long calls on an aged connection may still run: longer than the longest stream."""


class TenantScheduling(BaseModel):
    """How a tenant's requests are ordered for the engine (docs/service.md, "Fair shares and
    priorities")."""

    model_config = ConfigDict(use_attribute_docstrings=True, extra="forbid", frozen=True)

    weight: float = Field(1.0, gt=0, le=1000)
    """Its share of the engine's time against the other tenants waiting: 3 gets three times what
    1 gets."""
    priority: int = Field(0, ge=-1000, le=1000)
    """The priority of a request that names none (lower is more urgent, as vLLM's)."""
    min_priority: int = Field(0, ge=-1000, le=1000)
    """The most urgent priority a request of the tenant may name."""
    max_priority: int = Field(0, ge=-1000, le=1000)
    """The least urgent priority a request of the tenant may name."""

    @model_validator(mode="after")
    def _ordered(self) -> TenantScheduling:
        if not self.min_priority <= self.priority <= self.max_priority:
            raise ValueError("priority must lie within min_priority..max_priority")
        return self

    @property
    def prioritised(self) -> bool:
        """Whether any request of the tenant can have a priority other than 0."""
        return (self.min_priority, self.priority, self.max_priority) != (0, 0, 0)


# the key of TenantSettings.scheduling whose entry holds for every tenant it does not name
EVERY_TENANT = "*"


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
    newcomer_slots: int = Field(1, ge=0)
    """Engine slots a tenant that already runs leaves free, so that a tenant with nothing running
    starts within an engine step however long the others' runs are (vLLM frees no running slot
    for a newcomer); the price: a tenant alone runs max_num_seqs minus this many at once. 0:
    every slot to whoever waits, and a newcomer waits for a run to end."""
    max_labels: int = Field(ACTOR_DEFAULTS.max_tenants, gt=0)
    """Tenants whose counters are kept; beyond it the longest idle are forgotten (in mode none
    any caller can name a new tenant)."""
    scheduling: dict[str, TenantScheduling] = Field(default_factory=dict)
    """Weights and priorities by tenant, {"batch": {"weight": 1, "priority": 10,
    "max_priority": 20}}; "*": every tenant not named (default: weight 1, priority 0 only)."""

    @model_validator(mode="after")
    def _tenants_named(self) -> TenantSettings:
        for name in self.scheduling:
            if name != EVERY_TENANT and not _TENANT.fullmatch(name):
                raise ValueError(f"scheduling: {name[:64]!r} is not a tenant's name")
        return self

    def scheduling_of(self, tenant: str) -> TenantScheduling:
        """The weight and priorities of ``tenant``'s requests."""
        found = self.scheduling.get(tenant) or self.scheduling.get(EVERY_TENANT)
        return found if found is not None else _EQUAL

    @property
    def prioritised(self) -> bool:
        """Whether any request can have a priority other than 0: the engine then schedules by
        priority too."""
        return any(entry.prioritised for entry in self.scheduling.values())


_EQUAL = TenantScheduling()


__all__ = [
    "EVERY_TENANT",
    "AuthSettings",
    "ConnectionSettings",
    "Grant",
    "TenantScheduling",
    "TenantSettings",
]
