"""A lookup's stage: what kind of value it is, named once by the lookup and carried from there.

    cache.get(key, compute, tier=Stage.EMBEDDING.tier_use)
        ├─▶ each hook's lookup_started(tenant, key, stage): metrics and spans
        ├─▶ the flight: ask the second tier first? write the value back? under the stage's
        │   namespace and codec (tiers.py)
        └─▶ the stored entry: what Cache.Watch's watchers are told of it (events.py)

The names are part of mmgate's contract (a reply's ``CacheLookup.stage``, ``WatchEvent.stage``,
a Redis key's stage, the metrics' ``stage`` label): every list of them is derived from ``Stage``.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final, final


class Stage(enum.StrEnum):
    """The kind of value a lookup is for, and the step of the service that makes it."""

    ANY = ""  # no stage named (the actor used on its own); a Cache.Watch filter: every stage
    PROMPT = "prompt"  # a rendered, tokenized prompt
    IMAGE = "image"  # a decoded image
    EMBEDDING = "embedding"  # an image's encoder output
    RESPONSE = "response"  # an engine run shared by identical requests
    FETCH = "fetch"  # an image URL's bytes
    VIDEO = "video"  # a clip's sampled frames
    VIDEO_EMBEDDING = "video_embedding"  # a clip's encoder output

    @property
    def tier_use(self) -> TierUse:
        """How this stage's lookups use the second tier."""
        return _TIER_USES[self]

    @property
    def is_media(self) -> bool:
        """Its values are an image's or a clip's (its lookups' label is the digest): the media
        level of the metrics, and the digest a watcher is told."""
        return self in _MEDIA


@final
@dataclass(frozen=True, slots=True)
class TierUse:
    """How one lookup uses the second tier (a stage's own: ``Stage.tier_use``)."""

    stage: Stage = Stage.ANY  # the kind of value: the tier's namespace and codec for it
    read: bool = True  # ask the tier before computing
    write: bool = True  # store a computed value in the tier


# What the second tier holds of each stage, and why (services/pipeline/tier_values.py has the
# codecs): a stage kept in memory neither reads nor writes; a stage whose value is final only
# later reads, and its final value is handed to ``CacheActor.put``.
_TIER_USES: Final[Mapping[Stage, TierUse]] = MappingProxyType(
    {
        Stage.ANY: TierUse(Stage.ANY),
        # rendering again is cheaper than a round trip to the tier
        Stage.PROMPT: TierUse(Stage.PROMPT, read=False, write=False),
        # decoded pixels are not shared: the request carries the bytes
        Stage.IMAGE: TierUse(Stage.IMAGE, read=False, write=False),
        Stage.EMBEDDING: TierUse(Stage.EMBEDDING),
        # written once its run has finished normally, never while it is being generated
        Stage.RESPONSE: TierUse(Stage.RESPONSE, write=False),
        # a URL's bytes are fresh for a short window, on this replica
        Stage.FETCH: TierUse(Stage.FETCH, read=False, write=False),
        # decoding a clip costs far more than a round trip, unlike an image: frames are shared
        Stage.VIDEO: TierUse(Stage.VIDEO),
        Stage.VIDEO_EMBEDDING: TierUse(Stage.VIDEO_EMBEDDING),
    }
)

_MEDIA: Final = frozenset({Stage.IMAGE, Stage.EMBEDDING, Stage.VIDEO, Stage.VIDEO_EMBEDDING})
