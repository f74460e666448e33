"""Fault injection for reliability runs (docs/reliability.md): off unless enabled."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


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
    actor_kill_after: int | None = Field(None, ge=0)
    """Kill the cache actor once, when this many requests have started (its loop crashes as
    after a bug: every lookup waiting on it fails)."""
    actor_stall_after: int | None = Field(None, ge=0)
    """Stall the cache actor once, when this many requests have started: its loop takes no
    message for chaos.actor_stall_seconds."""
    actor_stall_seconds: float = Field(5.0, gt=0)
    """How long an injected stall holds the cache actor."""

    @model_validator(mode="after")
    def _explicitly_enabled(self) -> ChaosSettings:
        actor = self.actor_kill_after is not None or self.actor_stall_after is not None
        if not self.enabled and (self.any or actor or any(p.any for p in self.tenants.values())):
            raise ValueError(
                "fault rates are set but fault injection is off: set MMGATE_CHAOS__ENABLED=true "
                "to inject faults (never on a server that serves real callers)"
            )
        return self

    def plan(self, tenant: str) -> FaultPlan:
        return self.tenants.get(tenant, self)


__all__ = ["ChaosSettings", "FaultPlan", "Faults"]
