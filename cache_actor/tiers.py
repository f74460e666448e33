"""The second tier: a slower cache shared by replicas (Redis in production), behind a Protocol.

The actor consults it inside a flight, never in its own loop: a miss in memory asks the tier
first (with ``CacheConfig.tier_timeout``), and a computed value is written back in the background,
so a slow or broken tier never delays a waiter. Its errors count as misses; repeated read failures
open a circuit breaker (``CircuitBreaker``). With no tier configured, the actor skips all of this.

Each lookup says how it uses the tier with its stage's ``TierUse`` (stages.py): the stage (the
tier's namespace and codec for the value), whether to read before computing and whether to write
what it computed. A stage kept in memory only neither reads nor writes; one whose value is
written later, once it is final, reads only and hands the final value to ``CacheActor.put``.
"""

from __future__ import annotations

from typing import Any, Protocol, final, runtime_checkable

from .stages import Stage


@runtime_checkable
class SecondTier(Protocol):
    """A value store keyed by (tenant, stage, key). Implementations must honour ``timeout``."""

    @property
    def name(self) -> str:
        """Reported as the lookup's tier when a value came from here ("redis")."""
        ...

    async def get(self, tenant: str, key: str, *, stage: Stage, timeout: float) -> Any | None:
        """The value, or None when the tier does not hold it (or holds one that fails a check)."""
        ...

    async def set(
        self, tenant: str, key: str, value: Any, *, stage: Stage, timeout: float
    ) -> None: ...

    async def delete(self, tenant: str, key: str, *, stage: Stage | None, timeout: float) -> None:
        """Forget the key in ``stage``, or in every stage when None."""
        ...


@final
class InMemoryTier:
    """A process-local second tier: a plain dict, for tests and single-process development."""

    def __init__(self, name: str = "memory-tier") -> None:
        self._name = name
        self.values: dict[tuple[str, str], Any] = {}
        self.stages: dict[tuple[str, str], Stage] = {}  # the stage each value was written for
        self.gets = 0
        self.sets = 0

    @property
    def name(self) -> str:
        return self._name

    async def get(self, tenant: str, key: str, *, stage: Stage, timeout: float) -> Any | None:
        self.gets += 1
        return self.values.get((tenant, key))

    async def set(self, tenant: str, key: str, value: Any, *, stage: Stage, timeout: float) -> None:
        self.sets += 1
        self.values[(tenant, key)] = value
        self.stages[(tenant, key)] = stage

    async def delete(self, tenant: str, key: str, *, stage: Stage | None, timeout: float) -> None:
        self.values.pop((tenant, key), None)
        self.stages.pop((tenant, key), None)


@final
class CircuitBreaker:
    """Stops asking a failing tier for a while.

    Closed: every flight may ask. After ``failures`` consecutive errors it opens for ``seconds``;
    then flights may ask again, and one more error opens it anew.
    """

    __slots__ = ("_consecutive", "_failures", "_open_until", "_seconds")

    def __init__(self, failures: int, seconds: float) -> None:
        self._failures = failures
        self._seconds = seconds
        self._consecutive = 0
        self._open_until = 0.0

    def allows(self, now: float) -> bool:
        return now >= self._open_until

    def is_open(self, now: float) -> bool:
        return not self.allows(now)

    def record_success(self) -> None:
        self._consecutive = 0

    def record_failure(self, now: float) -> None:
        self._consecutive += 1
        if self._consecutive >= self._failures:
            self._open_until = now + self._seconds
            # half-open after the pause: a single further error reopens it
            self._consecutive = self._failures - 1
