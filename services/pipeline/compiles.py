"""Grammar compiles in the engine, one at a time per tenant: what a tenant leaves compiling holds
another tenant up by one compile at most.

    constrained request ─▶ gate.enter(tenant): waits while the tenant has a compile outstanding
        ─▶ to the engine ─▶ its first token: its grammar is compiled, and so is every grammar
                            sent before it (the engine compiles in the order it was handed them)
                         └▶ left before its first token (cancelled, deadline): the engine goes on
                            compiling it; still the tenant's until a later grammar is compiled,
                            or ``hold_seconds`` have passed

vLLM compiles structured-output grammars one at a time and never cancels an abandoned compile: a
tenant that sent three slow schemas and left at once made another tenant's yes/no choice wait
77.6 s for its first token. With one outstanding compile a tenant, the engine's queue of
compiles holds at most one of each tenant's ahead of anyone's. A tenant's own constrained
requests wait their turn instead (a schema compiled once is cached: the next is immediate).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import final


@final
@dataclass(eq=False, slots=True)
class Compile:
    """One constrained request's grammar, from its hand-over to the engine."""

    tenant: str
    order: int
    expires: float | None = None  # set when its caller left before the grammar was compiled


@final
class CompileGate:
    def __init__(self, hold_seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.hold_seconds = hold_seconds
        self.clock = clock
        self._outstanding: dict[str, Compile] = {}  # by tenant: at most one each
        self._orders = 0
        self._changed = asyncio.Event()

    async def enter(self, tenant: str) -> Compile:
        """The tenant's turn to hand the engine a grammar (bounded by the caller's deadline,
        which cancels the wait)."""
        while (held := self._outstanding.get(tenant)) is not None and not self._expired(held):
            self._changed.clear()
            if held.expires is None:
                await self._changed.wait()
            else:  # an abandoned compile: the tenant's until a later one ends, or it expires
                timeout = max(held.expires - self.clock(), 0.0)
                try:
                    async with asyncio.timeout(timeout):
                        await self._changed.wait()
                except TimeoutError:
                    pass
        self._orders += 1
        compile_ = self._outstanding[tenant] = Compile(tenant, self._orders)
        return compile_

    def compiled(self, compile_: Compile) -> None:
        """``compile_``'s first token came: it and every grammar handed over before it are done."""
        for tenant, held in list(self._outstanding.items()):
            if held.order <= compile_.order:
                del self._outstanding[tenant]
        self._changed.set()

    def left(self, compile_: Compile) -> None:
        """Its caller left (or the run failed) before a first token: the engine may still be
        compiling it, so it stays the tenant's for ``hold_seconds`` at most."""
        if self._outstanding.get(compile_.tenant) is compile_:
            compile_.expires = self.clock() + self.hold_seconds
        self._changed.set()

    def outstanding(self) -> int:
        return len(self._outstanding)

    def _expired(self, held: Compile) -> bool:
        if held.expires is not None and self.clock() >= held.expires:
            del self._outstanding[held.tenant]
            return True
        return False


__all__ = ["Compile", "CompileGate"]
