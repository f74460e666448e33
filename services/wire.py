"""mmgate's wire contract beyond the .proto files: headers, error reasons, image conventions.

What a client and the server must agree on and protobuf does not say. The standard library only:
the client (services/client.py) imports this and the generated proto modules, nothing else of
mmgate, so an internal service that only calls mmgate loads none of the server's dependencies.
"""

from __future__ import annotations

import hashlib
import re
from typing import Final

# Metadata a caller sends: the tenant its cache entries belong to. Where mmgate authenticates
# callers it must name the authenticated tenant (or be absent); without auth it is only a label.
TENANT_HEADER: Final = "x-mmgate-tenant"
# a bearer token (auth mode "token"): "authorization: Bearer <token>"
AUTHORIZATION_HEADER: Final = "authorization"
# where a request's caches live: the first image's digest, else the system prompt's; a proxy that
# hashes on it sends repeats to the replica that holds them
AFFINITY_HEADER: Final = "x-mmgate-affinity"
DEFAULT_TENANT: Final = "default"
TRACE_HEADERS: Final = ("traceparent", "tracestate")

# google.rpc.ErrorInfo: the domain of every reason mmgate sets, and the reasons.
ERROR_DOMAIN: Final = "mmgate.v1"
# a digest the server does not hold (any more): the client resends the image's bytes
IMAGE_NOT_FOUND: Final = "IMAGE_NOT_FOUND"
# the same for a video's digest: the client resends the clip's bytes
VIDEO_NOT_FOUND: Final = "VIDEO_NOT_FOUND"
OVERLOADED: Final = "OVERLOADED"
DRAINING: Final = "DRAINING"
ENGINE_UNAVAILABLE: Final = "ENGINE_UNAVAILABLE"
CACHE_UNAVAILABLE: Final = "CACHE_UNAVAILABLE"
MODEL_TAKES_NO_IMAGES: Final = "MODEL_TAKES_NO_IMAGES"
MODEL_TAKES_NO_VIDEO: Final = "MODEL_TAKES_NO_VIDEO"
ANSWER_TOO_LARGE: Final = "ANSWER_TOO_LARGE"  # more than the server sends in one message
INJECTED_FAULT: Final = "INJECTED_FAULT"  # a chaos run's fault (never with chaos off)
ADAPTER_NOT_FOUND: Final = "ADAPTER_NOT_FOUND"  # not served, or not this caller's to use
ADAPTER_REFUSED: Final = "ADAPTER_REFUSED"  # a LoadAdapter refused: nothing changed
REQUEST_ABORTED: Final = "REQUEST_ABORTED"  # ended by its caller's Inference.Abort
REQUEST_NOT_FOUND: Final = "REQUEST_NOT_FOUND"  # Abort: no such request of the caller's running
# authentication and tenants (docs/security.md)
CREDENTIALS_MISSING: Final = "CREDENTIALS_MISSING"
CREDENTIALS_INVALID: Final = "CREDENTIALS_INVALID"
TENANT_MISMATCH: Final = "TENANT_MISMATCH"  # x-mmgate-tenant names another tenant
UNTRUSTED_PEER: Final = "UNTRUSTED_PEER"  # mesh mode: the connection is not the sidecar's
ADMIN_ONLY: Final = "ADMIN_ONLY"
ENTRY_NOT_FOUND: Final = "ENTRY_NOT_FOUND"  # another tenant's entry: as if there were none
TENANT_OVERLOADED: Final = "TENANT_OVERLOADED"  # the tenant's own share of requests is in use
# images by URL (docs/security.md): a URL the guard refused (the rule named), a fetch that failed
URL_NOT_ALLOWED: Final = "URL_NOT_ALLOWED"
IMAGE_FETCH_FAILED: Final = "IMAGE_FETCH_FAILED"

# In a prompt or a chat message, where the request's next image goes.
IMAGE_PLACEHOLDER: Final = "<image>"
# In a chat message, where the request's next video goes.
VIDEO_PLACEHOLDER: Final = "<video>"
# The image formats mmgate decodes (nothing else: each format is a parser an attacker could aim at).
MIME_TYPES: Final = ("image/png", "image/jpeg", "image/webp")
# The video containers mmgate decodes, the same way: MP4 (and QuickTime), WebM, AVI.
VIDEO_MIME_TYPES: Final = ("video/mp4", "video/webm", "video/x-msvideo")

DIGEST_PREFIX: Final = "sha256:"
_DIGEST: Final = re.compile(r"sha256:[0-9a-f]{64}")


def digest_of(data: bytes) -> str:
    """An image's digest, as the server reports it and accepts it in place of the bytes."""
    return DIGEST_PREFIX + hashlib.sha256(data).hexdigest()


def is_digest(text: str) -> bool:
    """``sha256:`` and 64 lowercase hex digits."""
    return _DIGEST.fullmatch(text) is not None


__all__ = [
    "ADAPTER_NOT_FOUND",
    "ADAPTER_REFUSED",
    "ADMIN_ONLY",
    "AFFINITY_HEADER",
    "AUTHORIZATION_HEADER",
    "CACHE_UNAVAILABLE",
    "CREDENTIALS_INVALID",
    "CREDENTIALS_MISSING",
    "DEFAULT_TENANT",
    "DIGEST_PREFIX",
    "DRAINING",
    "ENGINE_UNAVAILABLE",
    "ENTRY_NOT_FOUND",
    "ERROR_DOMAIN",
    "IMAGE_FETCH_FAILED",
    "IMAGE_NOT_FOUND",
    "IMAGE_PLACEHOLDER",
    "INJECTED_FAULT",
    "MIME_TYPES",
    "MODEL_TAKES_NO_IMAGES",
    "MODEL_TAKES_NO_VIDEO",
    "OVERLOADED",
    "REQUEST_ABORTED",
    "REQUEST_NOT_FOUND",
    "TENANT_HEADER",
    "TENANT_MISMATCH",
    "TENANT_OVERLOADED",
    "TRACE_HEADERS",
    "UNTRUSTED_PEER",
    "URL_NOT_ALLOWED",
    "VIDEO_MIME_TYPES",
    "VIDEO_NOT_FOUND",
    "VIDEO_PLACEHOLDER",
    "digest_of",
    "is_digest",
]
