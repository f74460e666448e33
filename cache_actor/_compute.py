"""The compute wrapper: the body of a flight's task, which always posts a completion.

second tier? ── hit ──────────────┐
    │ miss, error or not asked    │
    ▼                             ▼
compute() → weigh ──────▶ mailbox.post(Done)   (whatever happened, BaseException included)
                                  │
                                  ▼ computed, and the tier was asked and answered
                          write back to the second tier (nobody waits for it)
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from ._messages import Done
from ._tier_io import TierIO
from .config import Weigher
from .flights import Flight
from .mailbox import Mailbox
from .stages import TierUse


async def run_flight(
    flight: Flight,
    compute: Callable[[], Awaitable[Any]],
    *,
    weigher: Weigher,
    mailbox: Mailbox,
    tier: TierIO | None,
    use: TierUse,
) -> None:
    """Load one value and post the outcome to the mailbox; ``tier`` is None when not to ask it
    (none configured, or its breaker is open), ``use`` says what this lookup does with it."""
    tenant, key = flight.full_key
    started = time.perf_counter()
    value: Any = None
    nbytes = 0
    tier_name: str | None = None
    tier_error: BaseException | None = None
    error: BaseException | None = None
    asked = tier is not None and use.read
    try:
        if tier is not None and use.read:
            value, tier_error = await tier.read(tenant, key, use.stage)
            if value is not None:
                tier_name = tier.name
        if value is None:
            value = await compute()
        nbytes = weigher(value)
    except BaseException as exc:  # noqa: BLE001 - every outcome must reach the mailbox
        error = exc
    # always post, whatever happened: a flight without a completion strands its waiters
    mailbox.post(
        Done(
            flight,
            value,
            nbytes,
            tier_name,
            error,
            tier_error,
            asked,
            time.perf_counter() - started,
        )
    )
    if error is not None:
        if not isinstance(error, Exception):
            raise error
        return
    # a failed read says nothing about the tier holding the key: no write-back into a broken tier
    if tier is not None and use.write and tier_name is None and tier_error is None:
        tier.write_back(tenant, key, value, use.stage)
