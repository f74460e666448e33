"""How failures reach a client: one gRPC status per failure, with google.rpc details.

InvalidRequest                 INVALID_ARGUMENT   + BadRequest naming each field
over capacity, CacheOverloaded RESOURCE_EXHAUSTED + ErrorInfo(reason=OVERLOADED)
ImageNotHeld (image digest)    NOT_FOUND          + ErrorInfo(reason=IMAGE_NOT_FOUND, digest, index)
ComputeTimeout, deadline       DEADLINE_EXCEEDED
CacheActorDead, engine down    UNAVAILABLE        + ErrorInfo(reason=...)
InjectedFault (chaos runs)     UNAVAILABLE        + ErrorInfo(reason=INJECTED_FAULT)
ModelTakesNoImages             FAILED_PRECONDITION + ErrorInfo(reason=MODEL_TAKES_NO_IMAGES)
Unauthenticated                UNAUTHENTICATED    + ErrorInfo(reason=CREDENTIALS_MISSING|_INVALID)
NotPermitted                   PERMISSION_DENIED  + ErrorInfo(reason=TENANT_MISMATCH|ADMIN_ONLY)
EntryNotFound                  NOT_FOUND          + ErrorInfo(reason=ENTRY_NOT_FOUND)
AdapterNotFound                NOT_FOUND          + ErrorInfo(reason=ADAPTER_NOT_FOUND)
AdapterRefused (a load)        INVALID_ARGUMENT   + BadRequest + ErrorInfo(reason=ADAPTER_REFUSED)
TenantOverloaded               RESOURCE_EXHAUSTED + ErrorInfo(reason=TENANT_OVERLOADED) + RetryInfo
UrlNotAllowed (image URL)      PERMISSION_DENIED  + ErrorInfo(reason=URL_NOT_ALLOWED, rule, index)
ImageFetchFailed               DEADLINE_EXCEEDED (timeout), UNAVAILABLE (connection, upstream 5xx)
                               or FAILED_PRECONDITION (upstream 4xx, not an image, too large)
                               + ErrorInfo(reason=IMAGE_FETCH_FAILED, index, upstream_status)
an answer past the send limit  RESOURCE_EXHAUSTED + ErrorInfo(reason=ANSWER_TOO_LARGE)
CacheRecursionError            INTERNAL           (the cycle goes to the log, not the client)
anything else                  INTERNAL           (the log has it; the client gets no class name)
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from typing import NoReturn

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from cache_actor import (
    CacheActorDead,
    CacheOverloaded,
    CacheRecursionError,
    ComputeTimeout,
)

from ..errors import (
    AdapterNotFound,
    AdapterRefused,
    EngineUnavailable,
    EntryNotFound,
    ImageFetchFailed,
    ImageNotHeld,
    InjectedFault,
    InvalidRequest,
    ModelTakesNoImages,
    NotPermitted,
    TenantOverloaded,
    Unauthenticated,
    UrlNotAllowed,
    Violation,
)
from ..wire import (
    ADAPTER_NOT_FOUND,
    ADAPTER_REFUSED,
    ANSWER_TOO_LARGE,
    CACHE_UNAVAILABLE,
    DRAINING,
    ENGINE_UNAVAILABLE,
    ENTRY_NOT_FOUND,
    ERROR_DOMAIN,
    IMAGE_FETCH_FAILED,
    IMAGE_NOT_FOUND,
    INJECTED_FAULT,
    MODEL_TAKES_NO_IMAGES,
    OVERLOADED,
    TENANT_OVERLOADED,
    URL_NOT_ALLOWED,
)

# ImageFetchFailed.kind -> the status a caller retries on, or not
_FETCH_CODES = {
    "timeout": grpc.StatusCode.DEADLINE_EXCEEDED,
    "unavailable": grpc.StatusCode.UNAVAILABLE,
    "refused": grpc.StatusCode.FAILED_PRECONDITION,
}

# What a refused-for-load caller is told to wait before trying again (google.rpc.RetryInfo).
RETRY_AFTER_SECONDS = 1.0

log = logging.getLogger("mmgate.errors")


class ServiceError(Exception):
    """A failure with the gRPC status it should end the call with."""

    def __init__(
        self,
        code: grpc.StatusCode,
        message: str,
        *,
        reason: str | None = None,
        violations: list[Violation] | None = None,
        metadata: dict[str, str] | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.retry_after = retry_after
        self.code = code
        self.message = message
        self.reason = reason
        self.violations = violations or []
        self.metadata = metadata or {}

    def to_status(self) -> grpc.Status:
        details: list[any_pb2.Any] = []
        if self.violations:
            bad_request = error_details_pb2.BadRequest(
                field_violations=[
                    error_details_pb2.BadRequest.FieldViolation(
                        field=v.field, description=v.description
                    )
                    for v in self.violations
                ]
            )
            packed = any_pb2.Any()
            packed.Pack(bad_request)
            details.append(packed)
        if self.reason:
            packed = any_pb2.Any()
            packed.Pack(
                error_details_pb2.ErrorInfo(
                    reason=self.reason, domain=ERROR_DOMAIN, metadata=self.metadata
                )
            )
            details.append(packed)
        if self.retry_after is not None:
            packed = any_pb2.Any()
            delay = duration_pb2.Duration()
            delay.FromTimedelta(datetime.timedelta(seconds=self.retry_after))
            packed.Pack(error_details_pb2.RetryInfo(retry_delay=delay))
            details.append(packed)
        code_number: int = self.code.value[0]
        return rpc_status.to_status(
            status_pb2.Status(code=code_number, message=self.message, details=details)
        )


def draining() -> ServiceError:
    return ServiceError(grpc.StatusCode.UNAVAILABLE, "the server is shutting down", reason=DRAINING)


def overloaded(active: int) -> ServiceError:
    return ServiceError(
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        f"{active} requests in progress; try again later",
        reason=OVERLOADED,
        retry_after=RETRY_AFTER_SECONDS,
    )


def answer_too_large(size: int, limit: int) -> ServiceError:
    return ServiceError(
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        f"the answer is {size} bytes, more than the {limit} this server sends in one message;"
        " stream it with Generate, or ask for fewer samples, tokens or log-probabilities",
        reason=ANSWER_TOO_LARGE,
    )


def invalid(violations: list[Violation]) -> ServiceError:
    message = "; ".join(f"{v.field}: {v.description}" for v in violations)
    return ServiceError(grpc.StatusCode.INVALID_ARGUMENT, message, violations=violations)


def from_exception(exc: BaseException) -> ServiceError:
    """The status a failure inside a request ends with."""
    if isinstance(exc, ServiceError):
        return exc
    if isinstance(exc, InvalidRequest):
        return invalid(exc.violations)
    if isinstance(exc, ModelTakesNoImages):
        return ServiceError(
            grpc.StatusCode.FAILED_PRECONDITION, str(exc), reason=MODEL_TAKES_NO_IMAGES
        )
    if isinstance(exc, Unauthenticated):
        return ServiceError(grpc.StatusCode.UNAUTHENTICATED, str(exc), reason=exc.reason)
    if isinstance(exc, NotPermitted):
        return ServiceError(grpc.StatusCode.PERMISSION_DENIED, str(exc), reason=exc.reason)
    if isinstance(exc, EntryNotFound):
        return ServiceError(grpc.StatusCode.NOT_FOUND, str(exc), reason=ENTRY_NOT_FOUND)
    if isinstance(exc, AdapterNotFound):
        return ServiceError(grpc.StatusCode.NOT_FOUND, str(exc), reason=ADAPTER_NOT_FOUND)
    if isinstance(exc, AdapterRefused):
        return ServiceError(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"adapter refused, nothing changed: {exc}",
            reason=ADAPTER_REFUSED,
            violations=[Violation(exc.field, exc.description)],
        )
    if isinstance(exc, TenantOverloaded):
        return ServiceError(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            str(exc),
            reason=TENANT_OVERLOADED,
            retry_after=RETRY_AFTER_SECONDS,
        )
    if isinstance(exc, ImageNotHeld):
        return ServiceError(
            grpc.StatusCode.NOT_FOUND,
            str(exc),
            reason=IMAGE_NOT_FOUND,
            metadata={"digest": exc.digest, "index": str(exc.index)},
        )
    if isinstance(exc, UrlNotAllowed):
        return ServiceError(
            grpc.StatusCode.PERMISSION_DENIED,
            str(exc),
            reason=URL_NOT_ALLOWED,
            metadata={"rule": exc.rule, "index": str(exc.index)},
        )
    if isinstance(exc, ImageFetchFailed):
        return ServiceError(
            _FETCH_CODES[exc.kind],
            str(exc),
            reason=IMAGE_FETCH_FAILED,
            metadata={"index": str(exc.index), "upstream_status": str(exc.upstream_status)},
        )
    if isinstance(exc, CacheRecursionError):
        log.error("cache recursion refused: %s (cycle %s)", exc, " -> ".join(exc.cycle))
        return ServiceError(
            grpc.StatusCode.INTERNAL, "internal error: a cache lookup would wait on itself"
        )
    if isinstance(exc, ComputeTimeout | TimeoutError):
        return ServiceError(grpc.StatusCode.DEADLINE_EXCEEDED, f"deadline exceeded: {exc}")
    if isinstance(exc, CacheOverloaded):
        return ServiceError(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc), reason=OVERLOADED)
    if isinstance(exc, CacheActorDead):
        # the actor's own message may name what crashed it: mmgate's words only
        return ServiceError(
            grpc.StatusCode.UNAVAILABLE,
            "the cache is not available",
            reason=CACHE_UNAVAILABLE,
        )
    if isinstance(exc, EngineUnavailable):
        return ServiceError(
            grpc.StatusCode.UNAVAILABLE,
            str(exc) or "the engine is not available",
            reason=ENGINE_UNAVAILABLE,
        )
    if isinstance(exc, InjectedFault):
        return ServiceError(grpc.StatusCode.UNAVAILABLE, str(exc), reason=INJECTED_FAULT)
    if type(exc).__name__ == "EngineDeadError":
        # vLLM's own words point at its log ("See stack trace (above)"): the log has them
        log.error("the engine has failed: %s", exc)
        return ServiceError(
            grpc.StatusCode.UNAVAILABLE, "the engine has failed", reason=ENGINE_UNAVAILABLE
        )
    log.exception("request failed", exc_info=exc)
    return ServiceError(grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}")


async def abort(context: grpc.aio.ServicerContext, error: ServiceError) -> NoReturn:
    if context.cancelled() or context.done():
        # the caller has gone (cancelled, or its deadline passed in gRPC's core first): there is
        # no one to tell, and a status sent to a finished call fails inside grpc with a traceback
        raise asyncio.CancelledError
    try:
        await context.abort_with_status(error.to_status())
    except grpc.aio.AbortError:
        raise
    except Exception:  # noqa: BLE001 - grpc's core refused to send: the call has ended there
        # its connection went or its deadline passed in core while the loop was busy: the call
        # ended in core before the loop heard, and grpc would log this as an error of ours
        log.debug("a status for a call that has ended was not sent: %s", error.message)
        raise asyncio.CancelledError from None
    raise AssertionError("abort_with_status returned")  # pragma: no cover
