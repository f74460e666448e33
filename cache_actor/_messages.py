"""What the actor's mailbox carries: one caller request and the control messages.

``_Get`` is the only request (offered, so it can be refused when the mailbox is full); every
other message is owed by something the actor already admitted and is posted, never refused
(see mailbox.py).
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, final

from .flights import Flight
from .stages import TierUse
from .store import FullKey


@final
@dataclass(slots=True)
class Get:
    full_key: FullKey
    compute: Callable[[], Awaitable[Any]]
    future: asyncio.Future[Any]
    context: contextvars.Context
    chain: tuple[Flight, ...]
    token: object | None
    # the caller's deadline on the loop's clock, armed by the actor when the caller must wait
    deadline: float
    wait: float
    tier_use: TierUse
    label: str = ""  # what the value is about, for watchers (an image's digest)
    # the flight this request starts is cancelled when its last waiter leaves
    cancel_when_orphaned: bool = False


@final
@dataclass(slots=True)
class Done:
    flight: Flight
    value: Any
    nbytes: int
    tier: str | None
    error: BaseException | None
    tier_error: BaseException | None
    tier_asked: bool
    load_seconds: float


@final
@dataclass(slots=True)
class WaiterLeft:
    full_key: FullKey
    future: asyncio.Future[Any]
    timed_out: bool


@final
@dataclass(slots=True)
class DeadlinePassed:
    flight: Flight


@final
@dataclass(slots=True)
class TierWriteFailed:
    error: BaseException


@final
@dataclass(slots=True)
class Query:
    """invalidate, inspect and ping: a synchronous function of the actor's state."""

    run: Callable[[], Any]
    future: asyncio.Future[Any]


@final
@dataclass(slots=True)
class Tick:
    lag: float


@final
@dataclass(slots=True)
class Fault:
    """Fault injection (reliability runs): "crash" the loop, or "stall" it ``seconds``."""

    kind: str
    seconds: float = 0.0


# ends the actor's loop at the next message; a plain object, so no handler can match it
CLOSE = object()
