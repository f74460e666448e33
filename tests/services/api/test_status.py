"""Failures as clients read them: one status each, in mmgate's words (no internals)."""

import asyncio
from typing import cast

import grpc
import pytest
from vllm.v1.engine.exceptions import EngineDeadError

from cache_actor import CacheActorDead, CacheOverloaded, CacheRecursionError, ComputeTimeout
from services.api.status import (
    RETRY_AFTER_SECONDS,
    STATUSES,
    ServiceError,
    abort,
    answering,
    from_exception,
)
from services.errors import (
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
from services.wire import (
    ADAPTER_NOT_FOUND,
    ADAPTER_REFUSED,
    ADMIN_ONLY,
    CACHE_UNAVAILABLE,
    CREDENTIALS_MISSING,
    DRAINING,
    ENGINE_UNAVAILABLE,
    ENTRY_NOT_FOUND,
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
DIGEST = "sha256:" + "ab" * 32
ALREADY = ServiceError(Code.RESOURCE_EXHAUSTED, "made before", reason=TENANT_OVERLOADED)

# (the failure, what the client reads: code, message, reason, ErrorInfo metadata, RetryInfo's
# delay, BadRequest's violations), as each was told before the table
TOLD = [
    (ALREADY, Code.RESOURCE_EXHAUSTED, "made before", TENANT_OVERLOADED, {}, None, []),
    (
        InvalidRequest([Violation("prompt", "empty"), Violation("n", "at most 8")]),
        Code.INVALID_ARGUMENT,
        "prompt: empty; n: at most 8",
        None,
        {},
        None,
        [Violation("prompt", "empty"), Violation("n", "at most 8")],
    ),
    (
        AdapterRefused("path", "no such folder"),
        Code.INVALID_ARGUMENT,
        "adapter refused, nothing changed: path: no such folder",
        ADAPTER_REFUSED,
        {},
        None,
        [Violation("path", "no such folder")],
    ),
    (
        ModelTakesNoImages("tiny"),
        Code.FAILED_PRECONDITION,
        "model tiny takes no images",
        MODEL_TAKES_NO_IMAGES,
        {},
        None,
        [],
    ),
    (
        ModelTakesNoVideo("tiny"),
        Code.FAILED_PRECONDITION,
        "model tiny takes no video",
        MODEL_TAKES_NO_VIDEO,
        {},
        None,
        [],
    ),
    (
        Unauthenticated("no credential", CREDENTIALS_MISSING),
        Code.UNAUTHENTICATED,
        "no credential",
        CREDENTIALS_MISSING,
        {},
        None,
        [],
    ),
    (
        NotPermitted("admins only", ADMIN_ONLY),
        Code.PERMISSION_DENIED,
        "admins only",
        ADMIN_ONLY,
        {},
        None,
        [],
    ),
    (
        EntryNotFound("no such entry"),
        Code.NOT_FOUND,
        "no such entry",
        ENTRY_NOT_FOUND,
        {},
        None,
        [],
    ),
    (
        AdapterNotFound("sql"),
        Code.NOT_FOUND,
        "no adapter 'sql' is served to this caller",
        ADAPTER_NOT_FOUND,
        {},
        None,
        [],
    ),
    (
        RequestNotFound(2),
        Code.NOT_FOUND,
        "none of the 2 request ids names a request of yours being answered",
        REQUEST_NOT_FOUND,
        {},
        None,
        [],
    ),
    (
        RequestAborted(),
        Code.CANCELLED,
        "the request was aborted (Inference.Abort)",
        REQUEST_ABORTED,
        {},
        None,
        [],
    ),
    (
        ImageNotHeld(DIGEST, 1),
        Code.NOT_FOUND,
        f"images[1]: image {DIGEST} is not held here; send its bytes",
        IMAGE_NOT_FOUND,
        {"digest": DIGEST, "index": "1"},
        None,
        [],
    ),
    (
        VideoNotHeld(DIGEST, 0),
        Code.NOT_FOUND,
        f"videos[0]: video {DIGEST} is not held here; send its bytes",
        VIDEO_NOT_FOUND,
        {"digest": DIGEST, "index": "0"},
        None,
        [],
    ),
    (
        UrlNotAllowed(1, "private", "a private address").at(0, "videos"),
        Code.PERMISSION_DENIED,
        "videos[0].url: a private address (rule: private)",
        URL_NOT_ALLOWED,
        {"rule": "private", "index": "0"},
        None,
        [],
    ),
    (
        UrlNotAllowed(0, "private", "a private address"),
        Code.PERMISSION_DENIED,
        "images[0].url: a private address (rule: private)",
        URL_NOT_ALLOWED,
        {"rule": "private", "index": "0"},
        None,
        [],
    ),
    (
        ImageFetchFailed(2, "timeout", "no answer in 5 s"),
        Code.DEADLINE_EXCEEDED,
        "images[2].url: no answer in 5 s",
        IMAGE_FETCH_FAILED,
        {"index": "2", "upstream_status": "0"},
        None,
        [],
    ),
    (
        ImageFetchFailed(0, "unavailable", "upstream 503", 503),
        Code.UNAVAILABLE,
        "images[0].url: upstream 503",
        IMAGE_FETCH_FAILED,
        {"index": "0", "upstream_status": "503"},
        None,
        [],
    ),
    (
        ImageFetchFailed(0, "refused", "upstream 404", 404),
        Code.FAILED_PRECONDITION,
        "images[0].url: upstream 404",
        IMAGE_FETCH_FAILED,
        {"index": "0", "upstream_status": "404"},
        None,
        [],
    ),
    (
        Draining(),
        Code.UNAVAILABLE,
        "the server is shutting down",
        DRAINING,
        {},
        None,
        [],
    ),
    (
        ServerOverloaded(4),
        Code.RESOURCE_EXHAUSTED,
        "4 requests in progress; try again later",
        OVERLOADED,
        {},
        RETRY_AFTER_SECONDS,
        [],
    ),
    (
        TenantOverloaded("a", 2),
        Code.RESOURCE_EXHAUSTED,
        "tenant a has 2 requests in progress; try again later",
        TENANT_OVERLOADED,
        {},
        RETRY_AFTER_SECONDS,
        [],
    ),
    (
        CacheOverloaded("the mailbox is full"),
        Code.RESOURCE_EXHAUSTED,
        "the mailbox is full",
        OVERLOADED,
        {},
        None,
        [],
    ),
    (
        ComputeTimeout("waited 2 s"),
        Code.DEADLINE_EXCEEDED,
        "deadline exceeded: waited 2 s",
        None,
        {},
        None,
        [],
    ),
    (TimeoutError(), Code.DEADLINE_EXCEEDED, "deadline exceeded: ", None, {}, None, []),
    (
        CacheActorDead("crashed: KeyError('x')"),
        Code.UNAVAILABLE,
        "the cache is not available",
        CACHE_UNAVAILABLE,
        {},
        None,
        [],
    ),
    (
        EngineUnavailable(),
        Code.UNAVAILABLE,
        "the engine is not available",
        ENGINE_UNAVAILABLE,
        {},
        None,
        [],
    ),
    (
        EngineDeadError(),
        Code.UNAVAILABLE,
        "the engine has failed",
        ENGINE_UNAVAILABLE,
        {},
        None,
        [],
    ),
    (
        InjectedFault("media"),
        Code.UNAVAILABLE,
        "injected fault: media failed",
        INJECTED_FAULT,
        {},
        None,
        [],
    ),
    (
        CacheRecursionError("a waits on itself", ("a", "b", "a")),
        Code.INTERNAL,
        "internal error: a cache lookup would wait on itself",
        None,
        {},
        None,
        [],
    ),
    (KeyError("secret"), Code.INTERNAL, "internal error: KeyError", None, {}, None, []),
    (
        asyncio.CancelledError(),
        Code.INTERNAL,
        "internal error: CancelledError",
        None,
        {},
        None,
        [],
    ),
]


@pytest.mark.parametrize(
    ("failure", "code", "message", "reason", "metadata", "retry_after", "violations"),
    TOLD,
    ids=[type(case[0]).__name__ for case in TOLD],
)
def test_the_table_tells_each_failure_as_before(
    failure: BaseException,
    code: grpc.StatusCode,
    message: str,
    reason: str | None,
    metadata: dict[str, str],
    retry_after: float | None,
    violations: list[Violation],
) -> None:
    error = from_exception(failure)
    told = (error.code, error.message, error.reason, error.metadata, error.retry_after)
    assert told == (code, message, reason, metadata, retry_after)
    assert error.violations == violations


def test_every_entry_of_the_table_is_told_above() -> None:
    def entry(failure: BaseException) -> type[BaseException] | str:
        return next(
            key for cls in type(failure).__mro__ for key in (cls, cls.__name__) if key in STATUSES
        )

    assert {entry(case[0]) for case in TOLD} == set(STATUSES)


def test_a_status_made_already_is_sent_as_it_is() -> None:
    assert from_exception(ALREADY) is ALREADY


def test_a_dead_engine_is_unavailable_in_mmgates_words() -> None:
    error = from_exception(EngineDeadError())  # vLLM's own: "See stack trace (above) ..."
    assert (error.code, error.reason) == (grpc.StatusCode.UNAVAILABLE, ENGINE_UNAVAILABLE)
    assert error.message == "the engine has failed"


def test_an_engine_not_ready_keeps_its_reason() -> None:
    error = from_exception(EngineUnavailable("the engine is not ready"))
    assert (error.code, error.message) == (grpc.StatusCode.UNAVAILABLE, "the engine is not ready")


class EndedInCore:
    """A call's context as the loop sees it when gRPC's core has ended the call (its connection
    gone) but the loop has not yet heard: still live, and a status sent to it fails."""

    def cancelled(self) -> bool:
        return False

    def done(self) -> bool:
        return False

    async def abort_with_status(self, status: grpc.Status) -> None:
        raise RuntimeError('Failed "execute_batch"')  # what grpc's core raises, by its message


async def test_a_status_for_a_call_core_has_ended_ends_the_handler_as_cancelled() -> None:
    # it once reached gRPC's handler wrapper, which logged it at ERROR with a traceback
    context = cast(grpc.aio.ServicerContext, EndedInCore())
    with pytest.raises(asyncio.CancelledError):
        await abort(context, ServiceError(grpc.StatusCode.UNAVAILABLE, "the engine has failed"))


class Live:
    """A live call's context: the statuses sent to it, each ending the handler as grpc does."""

    def __init__(self) -> None:
        self.sent: list[grpc.Status] = []

    def cancelled(self) -> bool:
        return False

    def done(self) -> bool:
        return False

    async def abort_with_status(self, status: grpc.Status) -> None:
        self.sent.append(status)
        raise grpc.aio.AbortError


async def test_answering_ends_the_call_with_the_failures_status_once() -> None:
    live = Live()
    context = cast(grpc.aio.ServicerContext, live)
    async with answering(context):
        pass  # no failure: nothing sent
    with pytest.raises(grpc.aio.AbortError):
        async with answering(context):
            raise EntryNotFound("no such entry")
    assert [status.code for status in live.sent] == [grpc.StatusCode.NOT_FOUND]
    assert [status.details for status in live.sent] == ["no such entry"]
    # a status sent inside the block is the call's end, not a failure to tell again
    with pytest.raises(grpc.aio.AbortError):
        async with answering(context):
            await abort(context, ServiceError(grpc.StatusCode.UNAVAILABLE, "the engine is down"))
    assert [status.code for status in live.sent] == [Code.NOT_FOUND, Code.UNAVAILABLE]


async def test_answering_lets_a_cancellation_pass() -> None:
    live = Live()
    with pytest.raises(asyncio.CancelledError):
        async with answering(cast(grpc.aio.ServicerContext, live)):
            raise asyncio.CancelledError
    assert live.sent == []
