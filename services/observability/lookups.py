"""Who watches the cache actor's lookups: traces and metrics, through one LookupHook.

    cache.get(key, tier=Stage.X.tier_use) ─ lookup_started(tenant, key, stage) ─▶ each hook
                                                            ─▶ tokens (one per hook)
                   ─ lookup_finished(token, LookupEvent) ─▶ each hook with its own token

The actor knows keys, not what they stand for; each lookup names its ``Stage`` once, in the
``TierUse`` it passes, and the actor hands it to the hooks. Both hooks name a lookup's stage with
:func:`stage_label` and its outcome with :func:`lookup_outcome`, so a span and a metric never
disagree about one lookup.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from typing import Final, final

from cache_actor import CacheOverloaded, CacheRecursionError, LookupEvent, LookupHook, Stage

# a lookup that named no stage, as metrics and spans call it
OTHER_STAGE: Final = "other"


def stage_label(stage: Stage) -> str:
    """A lookup's stage in metrics and spans: its name, or "other" (``Stage.ANY``)."""
    return stage.value or OTHER_STAGE


def lookup_outcome(event: LookupEvent) -> str:
    """hit | miss | coalesced, or how the lookup failed: rejected | timeout | cancelled | error."""
    if event.outcome is not None:
        return event.outcome.value
    error = event.error
    if isinstance(error, CacheRecursionError | CacheOverloaded):
        return "rejected"  # refused at once, never queued
    if isinstance(error, TimeoutError):  # ComputeTimeout among them
        return "timeout"
    if isinstance(error, asyncio.CancelledError):
        return "cancelled"  # the caller left (client gone, or the request's deadline)
    return "error"  # the computation failed, or the actor is gone


@final
class Observers:
    """Fans every lookup out to several hooks; a hook's failure is the actor's to log."""

    __slots__ = ("hooks",)

    def __init__(self, hooks: Sequence[LookupHook]) -> None:
        self.hooks = tuple(hooks)

    def lookup_started(self, tenant: str, key: str, stage: Stage) -> object:
        return tuple(hook.lookup_started(tenant, key, stage) for hook in self.hooks)

    def lookup_finished(self, token: object, event: LookupEvent) -> None:
        assert isinstance(token, tuple)
        leader = event.leader_token
        for i, (hook, own) in enumerate(zip(self.hooks, token, strict=True)):
            # each hook sees the leader's token as it returned it
            mine = leader[i] if isinstance(leader, tuple) and len(leader) > i else leader
            hook.lookup_finished(own, _with_leader(event, mine))


def _with_leader(event: LookupEvent, leader: object | None) -> LookupEvent:
    if leader is event.leader_token:
        return event
    return dataclasses.replace(event, leader_token=leader)
