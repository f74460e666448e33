"""Failures as clients read them: one status each, in mmgate's words (no internals)."""

import asyncio
from typing import cast

import grpc
import pytest
from vllm.v1.engine.exceptions import EngineDeadError

from services.api.status import ServiceError, abort, from_exception
from services.errors import EngineUnavailable
from services.wire import ENGINE_UNAVAILABLE


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
