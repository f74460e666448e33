"""The engine's plan: what the server decides before the engine starts, frozen, handed in once.

    model resolved ─▶ dtype chosen (dtypes.py) ─▶ media plan (the encoder's share, images)
        ─▶ EnginePlan ─▶ engine.start(plan)

Settings say what an operator asked for; the plan adds what only the start can know (the model's
folder, whether it takes images and in which form, the GPU share the encoder leaves). The engine
is never told anything after it is built: a second engine kind reads the same plan.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import final


@final
@dataclass(frozen=True, slots=True)
class ImageIntake:
    """How the engine takes images: up to ``per_prompt`` a request, as embeddings too; and up
    to ``videos`` clips a request (0: the model takes none), as embeddings too."""

    per_prompt: int
    embeddings: bool
    videos: int = 0
    video_embeddings: bool = False


@final
@dataclass(frozen=True, slots=True)
class EnginePlan:
    model: str  # a folder (or a hub name)
    images: ImageIntake | None = None  # None: the model takes none
    # the engine orders its queue, and picks what it preempts, by the requests' priorities
    by_priority: bool = False
    # the engine's share of its GPU once mmgate's encoder took its own; None: the settings'
    device_share: float | None = None


__all__ = ["EnginePlan", "ImageIntake"]
