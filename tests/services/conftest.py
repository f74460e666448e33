"""Real servers for the service tests: `mmgate serve` in a child process, real vLLM, loopback gRPC.

One server on the tiny test model serves the whole session (engine start takes seconds); tests
that stop a server or need the real default model start their own.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import grpc
import pytest

from services.client import MmgateClient
from services.models import build_tiny_model
from tests.support import ROOT, RunningServer, start_server

__all__ = ["ROOT", "RunningServer", "error_details", "start_server", "violated_fields"]


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(build_tiny_model(tmp_path_factory.mktemp("models") / "tiny"))


@pytest.fixture(scope="session")
def server(tiny_model: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    running = start_server(
        tmp_path_factory.mktemp("logs"),
        tiny_model,
        MMGATE_MAX_CONCURRENT_REQUESTS="16",
        # the idle-connection test waits for it
        MMGATE_METRICS__READ_TIMEOUT_SECONDS="2",
    )
    yield running
    assert running.stop() == 0, running.log()


@pytest.fixture
async def client(server: RunningServer) -> AsyncIterator[MmgateClient]:
    async with server.client(timeout=60.0) as client:
        yield client


def error_details(error: grpc.aio.AioRpcError) -> list[object]:
    """The google.rpc details a status carries (BadRequest, ErrorInfo)."""
    from google.rpc import error_details_pb2, status_pb2

    for key, value in error.trailing_metadata() or ():
        if key == "grpc-status-details-bin":
            assert isinstance(value, bytes)
            status = status_pb2.Status.FromString(value)
            assert status.code == error.code().value[0]
            found: list[object] = []
            for detail in status.details:
                for kind in (error_details_pb2.BadRequest, error_details_pb2.ErrorInfo):
                    if detail.Is(kind.DESCRIPTOR):
                        message = kind()
                        detail.Unpack(message)
                        found.append(message)
            return found
    return []


def violated_fields(error: grpc.aio.AioRpcError) -> set[str]:
    from google.rpc import error_details_pb2

    return {
        violation.field
        for detail in error_details(error)
        if isinstance(detail, error_details_pb2.BadRequest)
        for violation in detail.field_violations
    }
