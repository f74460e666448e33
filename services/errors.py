"""mmgate's own failures, raised below the API edge and turned into gRPC statuses there.

    MmgateError
     ├── InvalidRequest        the request cannot be served as sent (each Violation names a field)
     ├── ImageRejected         bytes mmgate will not decode (the media stage names the image)
     ├── ImageNotHeld          a digest this server does not hold (any more): resend the bytes
     ├── ModelTakesNoImages    images sent to a text-only model
     ├── EngineUnavailable     the engine is not started, has failed, or is shutting down
 └── InjectedFault         a failure injected on purpose (MMGATE_CHAOS__*, reliability runs)

The cache actor's own errors (cache_actor.errors) stay its own; services/api/status.py maps both
trees, and anything else, to one status each.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import final


class MmgateError(Exception):
    """The root of mmgate's own failures."""


@final
@dataclass(frozen=True, slots=True)
class Violation:
    field: str
    description: str


class InvalidRequest(MmgateError, ValueError):
    """The request cannot be served as sent."""

    def __init__(self, violations: list[Violation]) -> None:
        super().__init__("; ".join(f"{v.field}: {v.description}" for v in violations))
        self.violations = violations


class ImageRejected(MmgateError, ValueError):
    """The bytes are not an image mmgate will decode; the message says why."""


class ImageNotHeld(MmgateError, LookupError):
    """A request referred to an image by digest, and this server does not hold it (any more)."""

    def __init__(self, digest: str, index: int) -> None:
        super().__init__(f"images[{index}]: image {digest} is not held here; send its bytes")
        self.digest = digest
        self.index = index


class ModelTakesNoImages(MmgateError):
    """Images sent to a text-only model: refused before any image work."""

    def __init__(self, model: str) -> None:
        super().__init__(f"model {model} takes no images")
        self.model = model


class EngineUnavailable(MmgateError, RuntimeError):
    """The engine is not started, has failed, or is shutting down."""


class InjectedFault(MmgateError, RuntimeError):
    """A failure injected on purpose by the chaos settings: what ``point`` names failed."""

    def __init__(self, point: str) -> None:
        super().__init__(f"injected fault: {point} failed")
        self.point = point


__all__ = [
    "EngineUnavailable",
    "ImageNotHeld",
    "ImageRejected",
    "InjectedFault",
    "InvalidRequest",
    "MmgateError",
    "ModelTakesNoImages",
    "Violation",
]
