"""A media stage with the bug mmgate exists to stop: its decode step looks its own image up."""

from __future__ import annotations

from typing import Any

from cache_actor import Stage
from services.pipeline.media import DecodedImage, PixelsStage
from services.pipeline.request import MediaCall
from services.types import ImageInput


class ReEntering(PixelsStage):
    """A stage whose miss path re-enters the cache for the same key (the ghost-key failure)."""

    async def _decoded(self, source: ImageInput, call: MediaCall) -> Any:
        if source.data is None:  # the inner lookup, by reference: the stage's own
            return await super()._decoded(source, call)

        async def decode_and_audit() -> DecodedImage:
            # what a statistics hook in a lock-based cache did: look the image up again
            await self._image(ImageInput(source.index, None, source.digest), call)
            raise AssertionError("the re-entrant lookup returned")

        return await self.context.cache.get(
            self.stage_keys(source.digest)[Stage.IMAGE],
            decode_and_audit,
            tenant=call.tenant,
            tier=Stage.IMAGE.tier_use,
        )
