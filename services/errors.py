"""mmgate's own failures, raised below the API edge and turned into gRPC statuses there.

    MmgateError
     ├── InvalidRequest        the request cannot be served as sent (each Violation names a field)
     ├── ImageRejected         bytes mmgate will not decode (the media stage names the image)
     ├── VideoRejected         video bytes mmgate will not decode, or one that broke its bounds
     ├── DecodeStopped         a decode whose caller has gone was stopped
     ├── ImageNotHeld          a digest this server does not hold (any more): resend the bytes
     │    └── VideoNotHeld     the same for a clip's digest
     ├── UrlNotAllowed         a media URL the guard refused (the rule named, never the host)
     ├── ImageFetchFailed      a media URL not fetched: it timed out, was unavailable or refused
     ├── ModelTakesNoImages    images sent to a text-only model
     ├── ModelTakesNoVideo     videos sent to a model that takes none
     ├── EngineUnavailable     the engine is not started, has failed, or is shutting down
     ├── InjectedFault         a failure injected on purpose (MMGATE_CHAOS__*, reliability runs)
     ├── AdapterNotFound       an adapter the server does not serve, or the caller may not use
     ├── AdapterRefused        an adapter load refused: the folder, its rank or its shapes
     ├── Unauthenticated       no credential, or one mmgate does not know
     ├── NotPermitted          a known caller asking for what its role may not do
     ├── EntryNotFound         another tenant's entry: answered as if there were none
     ├── Draining              the server is shutting down: it starts no new call
     ├── ServerOverloaded      the server's own limit of concurrent requests is in use
     └── TenantOverloaded      the tenant's own share of concurrent requests is in use

The cache actor's own errors (cache_actor.errors) stay its own; services/api/status.py maps both
trees, and anything else, to one status each (its table, STATUSES).
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


class VideoRejected(MmgateError, ValueError):
    """The bytes are not a video mmgate will decode; the message says why."""


class DecodeStopped(MmgateError):
    """A decode whose caller has gone was stopped (between two frames)."""


class ImageNotHeld(MmgateError, LookupError):
    """A request referred to an image by digest, and this server does not hold it (any more)."""

    def __init__(self, digest: str, index: int) -> None:
        super().__init__(f"images[{index}]: image {digest} is not held here; send its bytes")
        self.digest = digest
        self.index = index


class VideoNotHeld(ImageNotHeld):
    """A request referred to a clip by digest, and this server does not hold its frames (any
    more, or not for the frames it asks for)."""

    def __init__(self, digest: str, index: int) -> None:
        MmgateError.__init__(
            self, f"videos[{index}]: video {digest} is not held here; send its bytes"
        )
        self.digest = digest
        self.index = index


class UrlNotAllowed(MmgateError):
    """An image URL the guard refused: the rule is named, never an internal host's address."""

    def __init__(self, index: int, rule: str, detail: str, field: str = "images") -> None:
        super().__init__(f"{field}[{index}].url: {detail} (rule: {rule})")
        self.index = index
        self.rule = rule
        self.detail = detail
        self.field = field

    def at(self, index: int, field: str = "images") -> UrlNotAllowed:
        """The same refusal for a request that has the URL at another index (a shared fetch),
        or in its ``field`` ("videos")."""
        return UrlNotAllowed(index, self.rule, self.detail, field)


class ImageFetchFailed(MmgateError):
    """An image URL that could not be fetched: ``kind`` "timeout" (DEADLINE_EXCEEDED),
    "unavailable" (a connection that failed, an upstream 5xx: UNAVAILABLE) or "refused" (an
    upstream 4xx, not an image, too large: FAILED_PRECONDITION). The upstream's status, never
    its body."""

    def __init__(
        self, index: int, kind: str, detail: str, upstream_status: int = 0, field: str = "images"
    ) -> None:
        super().__init__(f"{field}[{index}].url: {detail}")
        self.index = index
        self.kind = kind
        self.detail = detail
        self.upstream_status = upstream_status
        self.field = field

    def at(self, index: int, field: str = "images") -> ImageFetchFailed:
        """The same failure for a request that has the URL at another index (a shared fetch),
        or in its ``field`` ("videos")."""
        return ImageFetchFailed(index, self.kind, self.detail, self.upstream_status, field)


class ModelTakesNoImages(MmgateError):
    """Images sent to a text-only model: refused before any image work."""

    def __init__(self, model: str) -> None:
        super().__init__(f"model {model} takes no images")
        self.model = model


class ModelTakesNoVideo(MmgateError):
    """Videos sent to a model that takes none: refused before any video work."""

    def __init__(self, model: str) -> None:
        super().__init__(f"model {model} takes no video")
        self.model = model


class EngineUnavailable(MmgateError, RuntimeError):
    """The engine is not started, has failed, or is shutting down."""


class InjectedFault(MmgateError, RuntimeError):
    """A failure injected on purpose by the chaos settings: what ``point`` names failed."""

    def __init__(self, point: str) -> None:
        super().__init__(f"injected fault: {point} failed")
        self.point = point


class AdapterNotFound(MmgateError, LookupError):
    """A LoRA adapter the server does not serve, or one the caller may not use: the same answer
    either way, so that a tenant learns nothing of another's adapters."""

    def __init__(self, name: str) -> None:
        # the name as sent, cut short: a message never grows with what a caller sends
        super().__init__(f"no adapter {name[:64]!r} is served to this caller")
        self.name = name


class AdapterRefused(MmgateError, ValueError):
    """A load refused before anything changed; ``field`` is the request's field at fault."""

    def __init__(self, field: str, description: str) -> None:
        super().__init__(f"{field}: {description}")
        self.field = field
        self.description = description


class Unauthenticated(MmgateError):
    """No credential, or one mmgate does not know; ``reason`` is the ErrorInfo reason."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class NotPermitted(MmgateError):
    """An authenticated caller asking for what it may not do."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class EntryNotFound(MmgateError, LookupError):
    """Another tenant's entry, asked for by a caller who may not see it: the same answer whether
    that tenant holds it or not, so the answer leaks nothing."""


class RequestNotFound(MmgateError, LookupError):
    """Abort named no request of the caller's being answered: the same answer whether another
    tenant has one of those ids running or not."""

    def __init__(self, count: int) -> None:
        super().__init__(f"none of the {count} request ids names a request of yours being answered")


class RequestAborted(MmgateError):
    """A request ended by its caller's Inference.Abort."""

    def __init__(self) -> None:
        super().__init__("the request was aborted (Inference.Abort)")


class Draining(MmgateError):
    """The server is shutting down: calls in progress finish, no new one starts."""

    def __init__(self) -> None:
        super().__init__("the server is shutting down")


class ServerOverloaded(MmgateError):
    """The server's limit of concurrent requests is in use (for a tenant: the limit less the
    admins' reserve)."""

    def __init__(self, active: int) -> None:
        super().__init__(f"{active} requests in progress; try again later")
        self.active = active


class TenantOverloaded(MmgateError):
    """The tenant's own share of concurrent requests is in use."""

    def __init__(self, tenant: str, active: int) -> None:
        super().__init__(f"tenant {tenant} has {active} requests in progress; try again later")
        self.tenant = tenant
        self.active = active


__all__ = [
    "AdapterNotFound",
    "AdapterRefused",
    "DecodeStopped",
    "Draining",
    "EngineUnavailable",
    "EntryNotFound",
    "ImageFetchFailed",
    "ImageNotHeld",
    "ImageRejected",
    "InjectedFault",
    "InvalidRequest",
    "MmgateError",
    "ModelTakesNoImages",
    "ModelTakesNoVideo",
    "NotPermitted",
    "RequestAborted",
    "RequestNotFound",
    "ServerOverloaded",
    "TenantOverloaded",
    "Unauthenticated",
    "UrlNotAllowed",
    "VideoNotHeld",
    "VideoRejected",
    "Violation",
]
