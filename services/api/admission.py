"""Admission: whether a call may start work now, and what is in progress.

    admission.enter(tenant) ─▶ draining? ─▶ Draining
                            ─▶ the server's limit reached (for a tenant: its limit less the
                               admins' reserve)? ─▶ ServerOverloaded
                            ─▶ the tenant's share reached? ─▶ TenantOverloaded
                            ─▶ counted until the block ends, however it ends

Each refusal is a domain error (services/errors.py); status.py's table makes it UNAVAILABLE
(DRAINING) or RESOURCE_EXHAUSTED (OVERLOADED, TENANT_OVERLOADED) for the caller.

One object for every call that does a request's work (Inference.Generate and Complete,
Cache.Prefetch): the counts it keeps are what GetStats, the metrics and the drain at shutdown read.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import final

from prometheus_client.core import Metric

from ..errors import Draining, ServerOverloaded, TenantOverloaded
from ..observability.metric_families import admission_families
from .quotas import TenantQuotas


@final
class Admission:
    """The drain flag, the server's limit and each tenant's share, and the calls in progress."""

    def __init__(self, limit: int, quotas: TenantQuotas, admin_reserve: int = 0) -> None:
        self.limit = limit
        # calls only an admin may start: tenants at their full shares never lock the operator
        # out (at least one call is always left to tenants)
        self.admin_reserve = min(admin_reserve, limit - 1)
        self.quotas = quotas
        self.active = 0
        # calls in progress by tenant; a tenant leaves the map when its last one ends
        self.by_tenant: dict[str, int] = {}
        self.draining = False
        self._idle = asyncio.Event()

    def collect(self) -> Iterator[Metric]:
        """Calls in progress and the server's limit (metrics.py)."""
        return admission_families(self.active, self.limit)

    @contextlib.contextmanager
    def enter(self, tenant: str, *, admin: bool = False) -> Iterator[None]:
        """Count the block as one call of ``tenant``'s, or raise why it may not start now."""
        if self.draining:
            raise Draining()
        if self.active >= self.limit - (0 if admin else self.admin_reserve):
            raise ServerOverloaded(self.active)
        held = self.by_tenant.get(tenant, 0)
        if held >= self.quotas.concurrent_requests():
            raise TenantOverloaded(tenant, held)
        self.active += 1
        self.by_tenant[tenant] = held + 1
        try:
            yield
        finally:
            self.active -= 1
            count_down(self.by_tenant, tenant)
            if self.active == 0:
                self._idle.set()

    def active_of(self, tenant: str) -> int:
        return self.by_tenant.get(tenant, 0)

    async def drain(self, grace: float) -> bool:
        """Refuse new calls and wait up to ``grace`` seconds for those in progress.

        Done here rather than by grpc's own grace period, which can end a stream early when
        another call finishes during shutdown (grpc/grpc#37239).
        """
        self.draining = True
        if self.active == 0:
            return True
        self._idle.clear()
        try:
            async with asyncio.timeout(grace):
                await self._idle.wait()
        except TimeoutError:
            return False
        return True


def count_down(counts: dict[str, int], tenant: str) -> None:
    """One of ``tenant``'s counted calls or streams ended; it leaves ``counts`` with its last."""
    if counts[tenant] > 1:
        counts[tenant] -= 1
    else:
        del counts[tenant]


__all__ = ["Admission", "count_down"]
