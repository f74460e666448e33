"""The compile gate, without an engine: one grammar a tenant outstanding; a first token ends it
and every grammar handed over before it; a grammar left before its first token stays the
tenant's until a later one is compiled or its hold expires."""

from __future__ import annotations

import asyncio

from services.pipeline.compiles import CompileGate


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_a_tenant_waits_for_its_own_compile_never_for_anothers() -> None:
    gate = CompileGate(60.0)
    first = await gate.enter("a")
    other = await gate.enter("b")  # another tenant: not held up by a's compile
    second = asyncio.ensure_future(gate.enter("a"))
    await asyncio.sleep(0)
    assert not second.done()  # a's second grammar waits for its first
    gate.compiled(first)
    assert (await second).order > other.order
    assert gate.outstanding() == 2


async def test_a_first_token_ends_every_grammar_handed_over_before_it() -> None:
    gate = CompileGate(60.0)
    early = await gate.enter("a")
    gate.left(early)  # a left: the engine may still compile it
    late = await gate.enter("b")
    assert gate.outstanding() == 2
    gate.compiled(late)  # compiled in order: a's abandoned one is done too
    assert gate.outstanding() == 0
    assert (await gate.enter("a")).order > late.order


async def test_an_abandoned_compile_is_the_tenants_until_its_hold_expires() -> None:
    clock = Clock()
    gate = CompileGate(5.0, clock)
    left = await gate.enter("a")
    gate.left(left)
    clock.now = 5.0  # the hold is over: a may hand over another grammar
    assert (await gate.enter("a")).order == left.order + 1


async def test_a_cancelled_wait_leaves_nothing() -> None:
    gate = CompileGate(60.0)
    first = await gate.enter("a")
    waiting = asyncio.ensure_future(gate.enter("a"))
    await asyncio.sleep(0)
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)
    gate.compiled(first)
    assert gate.outstanding() == 0
