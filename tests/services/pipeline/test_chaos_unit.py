"""Fault injection, without an engine: refused unless enabled, the drawn shares, and what each
fault does to an operation and to an engine stream (the real server's chaos runs are in
tests/reliability/test_chaos.py)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncGenerator

import pytest
from pydantic import ValidationError

from services.config import ChaosSettings, Settings
from services.errors import InjectedFault
from services.pipeline.chaos import Chaos, NoChaos, injector


def chaos(**plan: object) -> Chaos:
    made = injector(ChaosSettings.model_validate({"enabled": True, "seed": 7, **plan}))
    assert isinstance(made, Chaos)
    return made


def test_fault_rates_without_enabled_are_refused() -> None:
    with pytest.raises(ValidationError, match="MMGATE_CHAOS__ENABLED=true"):
        Settings(chaos={"engine": {"stall": 0.1}})
    with pytest.raises(ValidationError, match="MMGATE_CHAOS__ENABLED=true"):
        Settings(chaos={"tenants": {"t": {"loop_block": 0.5}}})
    with pytest.raises(ValidationError, match="MMGATE_CHAOS__ENABLED=true"):
        Settings(chaos={"actor_kill_after": 3})
    with pytest.raises(ValidationError, match="MMGATE_CHAOS__ENABLED=true"):
        Settings(chaos={"actor_stall_after": 0})
    with pytest.raises(ValidationError, match="must not exceed 1"):
        Settings(chaos={"enabled": True, "decode": {"fail": 0.6, "slow": 0.6}})
    assert isinstance(injector(Settings().chaos), NoChaos)
    assert not injector(Settings().chaos).enabled


def test_the_server_refuses_to_start_with_rates_and_no_switch() -> None:
    env = {"MMGATE_CHAOS__DECODE__FAIL": "0.5", "PATH": ""}
    done = subprocess.run(
        [sys.executable, "-m", "services.cli", "serve", "--port", "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "MMGATE_CHAOS__ENABLED=true" in done.stderr
    assert "Traceback" not in done.stderr


async def test_the_drawn_shares_follow_the_rates_and_the_tenant() -> None:
    injected = chaos(decode={"fail": 0.2, "slow": 0.1}, slow_seconds=0.001, tenants={"calm": {}})
    results: Counter[str] = Counter()
    for _ in range(2000):
        try:
            await injected.inject("decode", "anyone")
            results["ok"] += 1
        except InjectedFault as exc:
            results[str(exc)] += 1
    failed = results["injected fault: decode failed"]
    assert set(results) == {"ok", "injected fault: decode failed"}
    assert 330 <= failed <= 470  # 400 expected
    assert 130 <= injected.injected["decode", "slow"] <= 270  # 200 expected
    assert injected.injected["decode", "fail"] == failed
    # another point, and a tenant with a plan of its own: nothing
    for _ in range(200):
        await injected.inject("encode", "anyone")
        await injected.inject("decode", "calm")
    assert sum(injected.injected.values()) == failed + injected.injected["decode", "slow"]


async def test_a_stall_holds_until_cancelled() -> None:
    stalled = asyncio.ensure_future(chaos(encode={"stall": 1.0}).inject("encode", "t"))
    done, _ = await asyncio.wait({stalled}, timeout=0.2)
    assert not done
    stalled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await stalled


class Stream:
    """An engine stream that records whether it was started and closed."""

    def __init__(self, deltas: int) -> None:
        self.deltas = deltas
        self.started = False
        self.closed = False

    async def run(self) -> AsyncGenerator[int, None]:
        self.started = True
        try:
            for delta in range(self.deltas):
                yield delta
        finally:
            self.closed = True


async def test_an_engine_fault_ends_the_stream_after_its_first_delta_and_closes_it() -> None:
    stream = Stream(5)
    got: list[int] = []

    async def consume() -> None:
        async for delta in chaos(engine={"fail": 1.0}).engine(stream.run(), "t"):
            got.append(delta)

    with pytest.raises(InjectedFault, match="engine failed"):
        await consume()
    assert got == [0]
    assert stream.closed  # the engine request is aborted, as for any early end


async def test_a_stalled_engine_request_never_reaches_the_engine() -> None:
    stream = Stream(5)
    faulty = chaos(engine={"stall": 1.0}).engine(stream.run(), "t")
    first = asyncio.ensure_future(anext(faulty))
    done, _ = await asyncio.wait({first}, timeout=0.2)
    assert not done
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    await faulty.aclose()
    assert not stream.started


async def test_no_chaos_hands_the_stream_back_untouched() -> None:
    stream = Stream(3).run()
    assert NoChaos().engine(stream, "t") is stream
    assert chaos(engine={"fail": 1.0}, tenants={"calm": {}}).engine(stream, "calm") is stream
    await stream.aclose()


def test_a_loop_block_holds_the_calling_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []
    monkeypatch.setattr("services.pipeline.chaos.time.sleep", slept.append)
    injected = chaos(loop_block=1.0, block_seconds=0.25)
    injected.at_request("t", ActorStandIn())  # type: ignore[arg-type]
    chaos(loop_block=0.0).at_request("t", ActorStandIn())  # type: ignore[arg-type]
    assert slept == [0.25]
    assert injected.injected == {("loop_block", "block"): 1}


class ActorStandIn:
    """What the actor's faults reach: the faults it was told to take."""

    def __init__(self) -> None:
        self.faults: list[tuple[str, float]] = []

    def inject_fault(self, kind: str, seconds: float = 0.0) -> None:
        self.faults.append((kind, seconds))


def test_the_actor_is_killed_and_stalled_once_each_after_so_many_requests() -> None:
    actor = ActorStandIn()
    injected = chaos(actor_kill_after=3, actor_stall_after=1, actor_stall_seconds=2.5)
    met: list[int] = []  # the requests that met a fault, counted from 1
    for request in range(1, 9):
        before = len(actor.faults)
        injected.at_request("t", actor)  # type: ignore[arg-type]
        met += [request] * (len(actor.faults) - before)
    assert actor.faults == [("stall", 2.5), ("crash", 0.0)]
    assert met == [2, 4]  # after 1 request, after 3
    assert injected.injected == {("actor", "stall"): 1, ("actor", "kill"): 1}
    untouched = ActorStandIn()
    chaos().at_request("t", untouched)  # type: ignore[arg-type]
    assert untouched.faults == []
