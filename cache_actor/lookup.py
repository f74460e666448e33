"""What a lookup returns, and the hook that sees every lookup begin and end."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from .stages import Stage

V = TypeVar("V")


class Outcome(enum.Enum):
    """How a successful lookup was served."""

    HIT = "hit"  # the value was stored in memory
    MISS = "miss"  # this lookup started the flight that loaded the value
    COALESCED = "coalesced"  # this lookup joined a flight another lookup had started


@dataclass(frozen=True, slots=True)
class Lookup(Generic[V]):
    """A served lookup.

    ``tier`` is "memory" for a hit, the second tier's name when the flight found the value there,
    and None when the value was computed.
    """

    value: V
    outcome: Outcome
    tier: str | None
    nbytes: int
    flight_id: int | None = None
    # the hook's token of the lookup that started the flight (see LookupEvent.leader_token)
    leader_token: object | None = field(default=None, repr=False, compare=False)
    # the flight asked the second tier and it failed: (its name, "timeout" or "error"); None
    # when it answered or was not asked
    tier_failure: tuple[str, str] | None = None


@dataclass(frozen=True, slots=True)
class LookupEvent:
    """The end of one lookup, as a hook sees it: either ``outcome`` or ``error`` is set."""

    tenant: str
    key: str
    outcome: Outcome | None
    tier: str | None
    wait_seconds: float
    nbytes: int | None
    error: BaseException | None
    flight_id: int | None
    tier_failure: tuple[str, str] | None  # see Lookup.tier_failure
    # The token ``lookup_started`` returned for the lookup that started the flight this one was
    # served by (its own token for a miss): lets a tracer link a coalesced lookup to the leader.
    leader_token: object | None


class LookupHook(Protocol):
    """Sees every lookup; the service implements it for traces and metrics.

    Both methods run in the caller's task. ``lookup_started`` runs before the request reaches the
    actor, so a computation started by this lookup runs in the context it leaves behind (a tracer
    can make its span current there and the computation's spans become its children). ``stage``
    is the one the lookup named (its ``TierUse``'s). Exceptions a hook raises are logged and
    otherwise ignored: observability never fails a lookup.
    """

    def lookup_started(self, tenant: str, key: str, stage: Stage) -> object: ...

    def lookup_finished(self, token: object, event: LookupEvent) -> None: ...
