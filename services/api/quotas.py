"""What one tenant may use: its share of concurrent requests and of the cache's bytes.

Set explicitly (MMGATE_TENANTS__MAX_CONCURRENT_REQUESTS, MMGATE_CACHE__MAX_BYTES_PER_TENANT), or,
once the credentials name more than one tenant, an equal share of the server's limits: the shares
add up to the limit, so no tenant's load or images can take what another's share holds. With one
tenant (or none: mode none, where labels are free) a tenant may use everything.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import final

from ..config import Settings


@final
class TenantQuotas:
    def __init__(self, settings: Settings, tenants: Callable[[], frozenset[str]]) -> None:
        self.settings = settings
        self.tenants = tenants  # read again on each call: a tokens reload may add tenants

    def _share(self, total: int) -> int | None:
        count = len(self.tenants())
        return max(1, total // count) if count > 1 else None

    def concurrent_requests(self) -> int:
        explicit = self.settings.tenants.max_concurrent_requests
        limit = self.settings.max_concurrent_requests
        if explicit is not None:
            return min(explicit, limit)
        # shared: what tenants may use, the server's limit less the calls kept for admins
        return self._share(limit - min(self.settings.admin_reserve, limit - 1)) or limit

    def cache_bytes(self) -> int | None:
        """A tenant's byte budget in the cache (None: the whole budget); fixed at start."""
        explicit = self.settings.cache.max_bytes_per_tenant
        return explicit if explicit is not None else self._share(self.settings.cache.max_bytes)


__all__ = ["TenantQuotas"]
