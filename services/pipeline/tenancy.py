"""Where each tenant's entries live, at every cache level, chosen once from the settings.

    mmgate's stages   (tenant, key) in the actor and mmgate:{ns}:{tenant}:... in Redis; images
                      under SHARED_TENANT instead when media is shared
    vLLM's caches     prefix cache: the request's cache_salt (mixed into the first block's hash,
                      so no block of one tenant's prompt matches another's); processor and
                      encoder caches: the image uuids mmgate hands vLLM, salted the same way

A tenant that could hit another's entry at any level could learn what the other sent (a hit is
faster, and cached_prompt_tokens says it outright), so nothing is shared unless a setting says so.
"""

from __future__ import annotations

import hashlib
from typing import Final, final

from ..config import TenantSettings

# The namespace of images when every tenant shares them (MMGATE_TENANTS__SHARE_MEDIA).
SHARED_TENANT: Final = "*shared*"


def _salt(tenant: str) -> str:
    return hashlib.sha256(f"mmgate-tenant\0{tenant}".encode()).hexdigest()[:32]


@final
class Isolation:
    def __init__(self, settings: TenantSettings) -> None:
        self.share_media = settings.share_media
        self.share_prefix = settings.share_prefix

    def media_tenant(self, tenant: str) -> str:
        """The namespace of the tenant's images in mmgate's cache."""
        return SHARED_TENANT if self.share_media else tenant

    def cache_salt(self, tenant: str) -> str | None:
        """The engine's prefix-cache salt for the tenant's requests (None: shared)."""
        return None if self.share_prefix else _salt(tenant)

    def image_uuids(self, tenant: str, digests: tuple[str, ...]) -> tuple[str, ...]:
        """The identities vLLM's processor and encoder caches key the tenant's images on."""
        if self.share_media:
            return digests
        salt = _salt(tenant)
        return tuple(f"{digest}+{salt}" for digest in digests)


__all__ = ["SHARED_TENANT", "Isolation"]
