"""Sharing between tenants, where a single organisation turns it on (mesh_server shares media
and prefixes): tenant beta then does get alpha's image from the cache and alpha's prefix from
vLLM's prefix cache, so the isolation tests, which find neither, would see a leak."""

from __future__ import annotations

from typing import Any

import pytest

from services.client import MmgateClient
from tests.services.auth.support import MESH_IDENTITIES, xfcc
from tests.services.imagegen import png
from tests.support import RunningServer

pytestmark = pytest.mark.asyncio(loop_scope="module")


def behind_sidecar(server: RunningServer, tenant: str) -> MmgateClient:
    """A client whose calls carry the identity the sidecar vouches for (the test is the mesh)."""
    uri = next(uri for uri, name in MESH_IDENTITIES.items() if name == tenant)
    client = MmgateClient(server.target, timeout=60.0)
    client.metadata = (("x-forwarded-client-cert", xfcc(uri)),)
    return client


async def test_shared_media_and_prefixes_are_shared(mesh_server: RunningServer) -> None:
    image = png(8181)
    text = "<image> " + " ".join(f"Shared clause {i} of the common prompt." for i in range(40))
    options: dict[str, Any] = {"max_tokens": 1, "temperature": 0.0, "raw": True}
    async with (
        behind_sidecar(mesh_server, "alpha") as alpha,
        behind_sidecar(mesh_server, "beta") as beta,
    ):
        assert (await beta.stats()).tenant == "beta"
        await alpha.complete(text, images=[image], **options)
        theirs = await beta.complete(text, images=[image], **options)
    assert theirs.final.cache.images[0].outcome == "hit"
    assert theirs.final.usage.cached_prompt_tokens >= 128
