"""A request's media items, worked on at once: every result, or the first failure by index.

    items ─▶ one task each ─▶ all done ─▶ their results, in order
                           └▶ one fails (or the caller is cancelled) ─▶ the others stop waiting
                              ─▶ the failure of the lowest index is raised

The others' flights go on in the cache actor and land in the cache for the next request, except
where their lookup asked to stop once nobody waits (a URL's fetch, a clip's decode).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar

T = TypeVar("T")


async def all_or_first_failure(work: Sequence[Coroutine[Any, Any, T]]) -> list[T]:
    """Each coroutine's result, run concurrently; the first failure (by index) raised."""
    tasks = [asyncio.ensure_future(item) for item in work]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    for task in tasks:
        if not task.cancelled() and (error := task.exception()) is not None:
            raise error
    return [task.result() for task in tasks]


__all__ = ["all_or_first_failure"]
