"""The errors a cache lookup can end with.

    Exception
    └── CacheError                      anything the cache actor raises on purpose
        ├── CacheRecursionError         a lookup would wait on itself (same key or a cycle)
        ├── ComputeTimeout              (also TimeoutError) the caller's wait or the flight's
        │                               compute deadline ran out
        ├── CacheOverloaded             the mailbox or the flight table is full; try later
        └── CacheActorDead              the actor has crashed or been closed

A computation's own exception is not wrapped: every waiter of that flight receives it with its
original type, so callers handle "the image is corrupt" the same way with or without a cache.
"""

from __future__ import annotations


class CacheError(Exception):
    """Base of every error the cache actor raises itself."""


class CacheRecursionError(CacheError):
    """A lookup would wait, directly or through other flights, on its own computation.

    Raised at once, never after a wait: the lock-based cache mmgate replaces hung forever here.
    ``cycle`` names the keys involved, outermost first.
    """

    def __init__(self, message: str, cycle: tuple[str, ...]) -> None:
        super().__init__(message)
        self.cycle = cycle


class ComputeTimeout(CacheError, TimeoutError):
    """The caller's wait, or the flight's compute deadline, ran out before a value was ready."""


class CacheOverloaded(CacheError):
    """The mailbox (or the table of flights) is full; the request was not queued."""


class CacheActorDead(CacheError):
    """The actor is closed or has crashed; no lookup can be served."""
