import asyncio
from typing import Any

import pytest

from cache_actor import CacheRecursionError, LookupEvent, Outcome, Stage
from tests.cache_actor.stats_check import MakeActor
from tests.support import Gate, until


class Recorder:
    def __init__(self) -> None:
        self.started: list[tuple[str, str]] = []
        self.finished: list[tuple[object, LookupEvent]] = []

    def lookup_started(self, tenant: str, key: str, stage: Stage) -> object:
        self.started.append((tenant, key))
        return f"span-{len(self.started)}"

    def lookup_finished(self, token: object, event: LookupEvent) -> None:
        self.finished.append((token, event))


async def test_hook_sees_every_outcome_and_links_to_the_leader(make_actor: MakeActor) -> None:
    hook = Recorder()
    cache = make_actor(hook=hook)
    gate = Gate(b"12345")
    leader = asyncio.ensure_future(cache.get("k", gate, tenant="t"))
    await gate.started.wait()
    follower = asyncio.ensure_future(cache.get("k", gate, tenant="t"))
    await until(lambda: cache.stats().waiters == 2)
    gate.release.set()
    await asyncio.gather(leader, follower)
    await cache.get("k", gate, tenant="t")

    events = {token: event for token, event in hook.finished}
    assert hook.started == [("t", "k")] * 3
    assert events["span-1"].outcome is Outcome.MISS
    assert events["span-2"].outcome is Outcome.COALESCED
    assert events["span-2"].leader_token == "span-1"  # a tracer links the join to the leader
    assert events["span-3"].outcome is Outcome.HIT
    assert events["span-3"].tier == "memory"
    assert all(e.nbytes == 5 and e.wait_seconds >= 0 for e in events.values())


async def test_hook_sees_errors(make_actor: MakeActor) -> None:
    hook = Recorder()
    cache = make_actor(hook=hook)

    async def reenters() -> bytes:
        return (await cache.get("k", reenters)).value

    with pytest.raises(CacheRecursionError):
        await cache.get("k", reenters)
    errors = [type(event.error) for _, event in hook.finished]
    assert errors == [CacheRecursionError, CacheRecursionError]  # the inner and the outer lookup
    assert all(event.outcome is None for _, event in hook.finished)


async def test_broken_hook_never_fails_a_lookup(
    make_actor: MakeActor, caplog: pytest.LogCaptureFixture
) -> None:
    class Broken:
        def lookup_started(self, tenant: str, key: str, stage: Stage) -> Any:
            raise RuntimeError("exporter down")

        def lookup_finished(self, token: object, event: LookupEvent) -> None:
            raise RuntimeError("exporter down")

    cache = make_actor(hook=Broken())
    gate = Gate()
    gate.release.set()
    assert (await cache.get("k", gate)).value == b"value"
    assert "hook" in caplog.text
