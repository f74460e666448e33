"""Failures as clients read them: one status each, in mmgate's words (no internals)."""

import grpc
from vllm.v1.engine.exceptions import EngineDeadError

from services.api.status import from_exception
from services.errors import EngineUnavailable
from services.wire import ENGINE_UNAVAILABLE


def test_a_dead_engine_is_unavailable_in_mmgates_words() -> None:
    error = from_exception(EngineDeadError())  # vLLM's own: "See stack trace (above) ..."
    assert (error.code, error.reason) == (grpc.StatusCode.UNAVAILABLE, ENGINE_UNAVAILABLE)
    assert error.message == "the engine has failed"


def test_an_engine_not_ready_keeps_its_reason() -> None:
    error = from_exception(EngineUnavailable("the engine is not ready"))
    assert (error.code, error.message) == (grpc.StatusCode.UNAVAILABLE, "the engine is not ready")
