"""Who watches the cache actor's lookups: traces and metrics, through one LookupHook.

    cache.get(key) ─ lookup_started(tenant, key) ─▶ each hook ─▶ tokens (one per hook)
                   ─ lookup_finished(token, LookupEvent) ─▶ each hook with its own token

The actor knows keys, not what they stand for; the service says which stage a lookup belongs to
(``prompt``, ``response``, ``image``, ``embedding``) with :func:`stage`, a context variable the
hooks read in ``lookup_started`` (it runs in the caller's task).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Iterator, Sequence
from typing import final

from cache_actor import LookupEvent, LookupHook

_STAGE: contextvars.ContextVar[str] = contextvars.ContextVar("mmgate_cache_stage", default="")


@contextlib.contextmanager
def stage(name: str) -> Iterator[None]:
    """Lookups made inside belong to cache stage ``name``."""
    token = _STAGE.set(name)
    try:
        yield
    finally:
        _STAGE.reset(token)


def current_stage() -> str:
    return _STAGE.get() or "other"


@final
class Observers:
    """Fans every lookup out to several hooks; a hook's failure is the actor's to log."""

    __slots__ = ("hooks",)

    def __init__(self, hooks: Sequence[LookupHook]) -> None:
        self.hooks = tuple(hooks)

    def lookup_started(self, tenant: str, key: str) -> object:
        return tuple(hook.lookup_started(tenant, key) for hook in self.hooks)

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
