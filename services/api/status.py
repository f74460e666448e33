"""How failures reach a client: one gRPC status per failure, with google.rpc details.

    a servicer method ─▶ async with answering(context): its work ─▶ raises
        ─▶ from_exception: the exception's classes, its own first (its MRO), looked up in
           STATUSES; the first one there makes the status ─▶ abort(context, status)

STATUSES is the one list of what each failure is told; anything not named in it is INTERNAL (the
log has it, the client gets no class name).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, Final, NoReturn

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from cache_actor import (
    CacheActorDead,
    CacheOverloaded,
    CacheRecursionError,
)

from ..errors import (
    AdapterNotFound,
    AdapterRefused,
    Draining,
    EngineUnavailable,
    EntryNotFound,
    ImageFetchFailed,
    ImageNotHeld,
    InjectedFault,
    InvalidRequest,
    ModelTakesNoImages,
    ModelTakesNoVideo,
    NotPermitted,
    RequestAborted,
    RequestNotFound,
    ServerOverloaded,
    TenantOverloaded,
    Unauthenticated,
    UrlNotAllowed,
    VideoNotHeld,
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
    MODEL_TAKES_NO_VIDEO,
    OVERLOADED,
    REQUEST_ABORTED,
    REQUEST_NOT_FOUND,
    TENANT_OVERLOADED,
    URL_NOT_ALLOWED,
    VIDEO_NOT_FOUND,
)

Code = grpc.StatusCode

# ImageFetchFailed.kind -> the status a caller retries on, or not
_FETCH_CODES = {
    "timeout": Code.DEADLINE_EXCEEDED,
    "unavailable": Code.UNAVAILABLE,
    "refused": Code.FAILED_PRECONDITION,
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


def answer_too_large(size: int, limit: int) -> ServiceError:
    return ServiceError(
        Code.RESOURCE_EXHAUSTED,
        f"the answer is {size} bytes, more than the {limit} this server sends in one message;"
        " stream it with Generate, or ask for fewer samples, tokens or log-probabilities",
        reason=ANSWER_TOO_LARGE,
    )


# How one failure becomes its status: an entry of STATUSES.
ToStatus = Callable[[Any], ServiceError]


def invalid(violations: list[Violation]) -> ServiceError:
    message = "; ".join(f"{v.field}: {v.description}" for v in violations)
    return ServiceError(Code.INVALID_ARGUMENT, message, violations=violations)


def _said(code: grpc.StatusCode, reason: str, *, retry: bool = False) -> ToStatus:
    """The failure's own message, with ``code`` and ``reason`` (``retry``: and RetryInfo)."""
    retry_after = RETRY_AFTER_SECONDS if retry else None
    return lambda exc: ServiceError(code, str(exc), reason=reason, retry_after=retry_after)


def _own_reason(code: grpc.StatusCode) -> ToStatus:
    """The failure's own message and the reason it carries, with ``code``."""
    return lambda exc: ServiceError(code, str(exc), reason=exc.reason)


def _adapter_refused(exc: AdapterRefused) -> ServiceError:
    return ServiceError(
        Code.INVALID_ARGUMENT,
        f"adapter refused, nothing changed: {exc}",
        reason=ADAPTER_REFUSED,
        violations=[Violation(exc.field, exc.description)],
    )


def _image_not_held(exc: ImageNotHeld) -> ServiceError:
    metadata = {"digest": exc.digest, "index": str(exc.index)}
    reason = VIDEO_NOT_FOUND if isinstance(exc, VideoNotHeld) else IMAGE_NOT_FOUND
    return ServiceError(Code.NOT_FOUND, str(exc), reason=reason, metadata=metadata)


def _url_not_allowed(exc: UrlNotAllowed) -> ServiceError:
    metadata = {"rule": exc.rule, "index": str(exc.index)}
    return ServiceError(Code.PERMISSION_DENIED, str(exc), reason=URL_NOT_ALLOWED, metadata=metadata)


def _fetch_failed(exc: ImageFetchFailed) -> ServiceError:
    metadata = {"index": str(exc.index), "upstream_status": str(exc.upstream_status)}
    return ServiceError(
        _FETCH_CODES[exc.kind], str(exc), reason=IMAGE_FETCH_FAILED, metadata=metadata
    )


def _cache_recursion(exc: CacheRecursionError) -> ServiceError:
    log.error("cache recursion refused: %s (cycle %s)", exc, " -> ".join(exc.cycle))
    return ServiceError(Code.INTERNAL, "internal error: a cache lookup would wait on itself")


def _engine_failed(exc: BaseException) -> ServiceError:
    # vLLM's own words point at its log ("See stack trace (above)"): the log has them
    log.error("the engine has failed: %s", exc)
    return ServiceError(Code.UNAVAILABLE, "the engine has failed", reason=ENGINE_UNAVAILABLE)


def _internal(exc: BaseException) -> ServiceError:
    log.exception("request failed", exc_info=exc)
    return ServiceError(Code.INTERNAL, f"internal error: {type(exc).__name__}")


# What each failure is told. from_exception walks the exception's classes, its own first (its
# MRO), and the first one named here decides. A string names a class that services.api may not
# import (vLLM's: the import contracts), matched by its name.
STATUSES: Final[Mapping[type[BaseException] | str, ToStatus]] = {
    ServiceError: lambda exc: exc,  # a status made already (a watcher past its tenant's limit)
    # the request as sent: + BadRequest naming each field
    InvalidRequest: lambda exc: invalid(exc.violations),
    AdapterRefused: _adapter_refused,
    ModelTakesNoImages: _said(Code.FAILED_PRECONDITION, MODEL_TAKES_NO_IMAGES),
    ModelTakesNoVideo: _said(Code.FAILED_PRECONDITION, MODEL_TAKES_NO_VIDEO),
    # who asks: the reason is the failure's own
    Unauthenticated: _own_reason(Code.UNAUTHENTICATED),  # CREDENTIALS_MISSING or _INVALID
    NotPermitted: _own_reason(Code.PERMISSION_DENIED),  # TENANT_MISMATCH or ADMIN_ONLY
    # not there, or not there for this caller: one answer either way, so nothing leaks
    EntryNotFound: _said(Code.NOT_FOUND, ENTRY_NOT_FOUND),
    AdapterNotFound: _said(Code.NOT_FOUND, ADAPTER_NOT_FOUND),
    RequestNotFound: _said(Code.NOT_FOUND, REQUEST_NOT_FOUND),
    # ended by its own caller's Abort
    RequestAborted: _said(Code.CANCELLED, REQUEST_ABORTED),
    # + the digest and its index: resend the bytes (a clip's: VIDEO_NOT_FOUND)
    ImageNotHeld: _image_not_held,
    # image URLs: the rule, or the upstream's status, never an internal host or a body
    UrlNotAllowed: _url_not_allowed,
    ImageFetchFailed: _fetch_failed,  # its code by kind: _FETCH_CODES
    # refused for load; RetryInfo where the server knows its own wait
    Draining: _said(Code.UNAVAILABLE, DRAINING),
    ServerOverloaded: _said(Code.RESOURCE_EXHAUSTED, OVERLOADED, retry=True),
    TenantOverloaded: _said(Code.RESOURCE_EXHAUSTED, TENANT_OVERLOADED, retry=True),
    CacheOverloaded: _said(Code.RESOURCE_EXHAUSTED, OVERLOADED),
    # the deadline: the cache's ComputeTimeout is a TimeoutError too
    TimeoutError: lambda exc: ServiceError(Code.DEADLINE_EXCEEDED, f"deadline exceeded: {exc}"),
    # parts of the server out of service, in mmgate's words (the actor's may name its crash)
    CacheActorDead: lambda exc: ServiceError(
        Code.UNAVAILABLE, "the cache is not available", reason=CACHE_UNAVAILABLE
    ),
    EngineUnavailable: lambda exc: ServiceError(
        Code.UNAVAILABLE, str(exc) or "the engine is not available", reason=ENGINE_UNAVAILABLE
    ),
    "EngineDeadError": _engine_failed,
    InjectedFault: _said(Code.UNAVAILABLE, INJECTED_FAULT),  # chaos runs
    # mmgate's own faults: the log has them, the client a plain INTERNAL
    CacheRecursionError: _cache_recursion,
    BaseException: _internal,  # anything else
}


def from_exception(exc: BaseException) -> ServiceError:
    """The status a failure inside a request ends with: STATUSES' entry for the first of the
    exception's classes, in MRO order, that has one."""
    for cls in type(exc).__mro__:
        to_status = STATUSES.get(cls) or STATUSES.get(cls.__name__)
        if to_status is not None:
            return to_status(exc)
    raise AssertionError("BaseException is in every exception's MRO")  # pragma: no cover


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


@contextlib.asynccontextmanager
async def answering(context: grpc.aio.ServicerContext) -> AsyncIterator[None]:
    """``async with answering(context):`` around a servicer method's work: a failure inside ends
    the call with its status. A status already sent (AbortError) and a cancellation pass as
    they are."""
    try:
        yield
    except grpc.aio.AbortError:
        raise
    except Exception as exc:  # noqa: BLE001 - every failure becomes one clear status
        await abort(context, from_exception(exc))
