"""Admission on its own: the drain flag, the server's limit, a tenant's share and the counts."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from services.api.admission import Admission
from services.api.quotas import TenantQuotas
from services.api.status import from_exception
from services.config import Settings
from services.errors import Draining, ServerOverloaded, TenantOverloaded
from services.wire import DRAINING, OVERLOADED
from tests.support import eventually


def admission(
    limit: int = 4, tenants: frozenset[str] = frozenset({"a", "b"}), reserve: int = 0
) -> Admission:
    settings = Settings(max_concurrent_requests=limit, admin_reserve=reserve)
    return Admission(limit, TenantQuotas(settings, lambda: tenants), reserve)


def test_a_call_is_counted_until_its_block_ends_however_it_ends() -> None:
    gate = admission()
    with gate.enter("a"):
        assert (gate.active, gate.active_of("a"), gate.active_of("b")) == (1, 1, 0)
        seen: list[dict[str, int]] = []

        def failing_call() -> None:
            with gate.enter("b"):
                seen.append(dict(gate.by_tenant))
                raise RuntimeError("the call failed")

        with pytest.raises(RuntimeError):
            failing_call()
        assert seen == [{"a": 1, "b": 1}]
        assert gate.by_tenant == {"a": 1}
    assert (gate.active, gate.by_tenant) == (0, {})


def test_the_servers_limit_then_a_tenants_share() -> None:
    gate = admission(limit=4)  # two tenants: a share of 2 each
    with gate.enter("a"), gate.enter("a"):
        with pytest.raises(TenantOverloaded):
            gate.enter("a").__enter__()
        with gate.enter("b"), gate.enter("b"):
            with pytest.raises(ServerOverloaded) as caught:
                gate.enter("b").__enter__()
            told = from_exception(caught.value)
            assert (told.code, told.reason) == (grpc.StatusCode.RESOURCE_EXHAUSTED, OVERLOADED)
    # a refusal counted nothing
    assert (gate.active, gate.by_tenant) == (0, {})


def test_the_admins_reserve_is_theirs_alone() -> None:
    gate = admission(limit=6, reserve=2)  # two tenants: (6 - 2) / 2 = a share of 2 each
    with gate.enter("a"), gate.enter("a"), gate.enter("b"), gate.enter("b"):
        with pytest.raises(ServerOverloaded) as caught:
            gate.enter("c").__enter__()  # a third tenant: the rest is the admins'
        assert from_exception(caught.value).reason == OVERLOADED
        with gate.enter("ops", admin=True), gate.enter("ops", admin=True):
            assert gate.active == 6
            with pytest.raises(ServerOverloaded):
                gate.enter("ops", admin=True).__enter__()  # the server's limit holds for all
    assert (gate.active, gate.by_tenant) == (0, {})


async def test_the_drain_refuses_new_calls_and_waits_for_those_in_progress() -> None:
    gate = admission()
    entered, leave = asyncio.Event(), asyncio.Event()

    async def call() -> None:
        with gate.enter("a"):
            entered.set()
            await leave.wait()

    async def draining() -> bool:
        return gate.draining

    running = asyncio.create_task(call())
    await entered.wait()
    assert gate.active == 1
    drained = asyncio.create_task(gate.drain(30))
    await eventually(draining, timeout=10)
    with pytest.raises(Draining) as caught:
        gate.enter("b").__enter__()
    told = from_exception(caught.value)
    assert (told.code, told.reason) == (grpc.StatusCode.UNAVAILABLE, DRAINING)
    assert not drained.done()
    leave.set()
    assert await drained is True
    await running


async def test_a_drain_past_its_grace_says_so() -> None:
    gate = admission()
    with gate.enter("a"):
        assert await gate.drain(0.01) is False
    assert await gate.drain(0.01) is True
