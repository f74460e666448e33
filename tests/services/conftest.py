"""Real servers for the service tests: `mmgate serve` in a child process, real vLLM, loopback gRPC.

One server on the tiny test model serves the whole session (engine start takes seconds); tests
that stop a server or need the real default model start their own.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.client import MmgateClient
from services.models import build_tiny_model

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT = 240.0
STOP_TIMEOUT = 90.0
MiB = 1024 * 1024


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class RunningServer:
    process: subprocess.Popen[bytes]
    port: int
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    # health of "" as seen from the moment the port opened until SERVING
    startup_statuses: list[int] = field(default_factory=list)

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def log(self, lines: int = 60) -> str:
        text = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    @property
    def metrics_url(self) -> str:
        """The /metrics address the server logged at start (its metrics port may be any)."""
        import re

        found = re.search(r"metrics on (http://\S+/metrics)", self.log_path.read_text("utf-8"))
        assert found is not None, f"no metrics address in the server's log:\n{self.log()}"
        return found.group(1)

    def client(self, **kwargs: object) -> MmgateClient:
        return MmgateClient(self.target, **kwargs)  # type: ignore[arg-type]

    def stop(self) -> int:
        """SIGTERM, then wait for a clean exit; a hang fails the test instead of blocking."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)
            raise AssertionError(f"server ignored SIGTERM:\n{self.log()}") from None


def start_server(log_dir: Path, model: str | None, **settings: str) -> RunningServer:
    port = free_port()
    env = dict(os.environ)
    env.update(
        {
            "MMGATE_HOST": "127.0.0.1",
            "MMGATE_PORT": str(port),
            "MMGATE_ENGINE__KV_CACHE_MEMORY_BYTES": str(256 * MiB),
            "MMGATE_ENGINE__MAX_MODEL_LEN": "1024",
            # the oversized-message tests are written against 4 MiB
            "MMGATE_MAX_MESSAGE_BYTES": str(4 * MiB),
            # several servers run at once: each its own free metrics port
            "MMGATE_METRICS__PORT": "0",
            "MMGATE_LOG_LEVEL": "INFO",
            "HF_HUB_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
        }
    )
    if model is not None:
        env["MMGATE_ENGINE__MODEL"] = model
    env.update(settings)
    log_path = log_dir / f"server-{port}.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "services.cli", "serve"],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    server = RunningServer(process, port, log_path, env)
    try:
        wait_serving(server)
    except BaseException:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)
        raise
    return server


def wait_serving(server: RunningServer) -> None:
    """Block until the server's health says SERVING (the Watch stream: no polling)."""
    with grpc.insecure_channel(server.target) as channel:
        try:
            grpc.channel_ready_future(channel).result(timeout=60)
            stream = health_pb2_grpc.HealthStub(channel).Watch(
                health_pb2.HealthCheckRequest(service=""), timeout=START_TIMEOUT
            )
            for update in stream:
                server.startup_statuses.append(update.status)
                if update.status == health_pb2.HealthCheckResponse.SERVING:
                    stream.cancel()
                    return
        except (grpc.FutureTimeoutError, grpc.RpcError) as error:
            raise AssertionError(
                f"server did not become ready ({error!r}); exit code {server.process.poll()}:\n"
                f"{server.log()}"
            ) from None
    raise AssertionError(f"health stream ended before SERVING:\n{server.log()}")


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(build_tiny_model(tmp_path_factory.mktemp("models") / "tiny"))


@pytest.fixture(scope="session")
def server(tiny_model: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    running = start_server(
        tmp_path_factory.mktemp("logs"),
        tiny_model,
        MMGATE_MAX_CONCURRENT_REQUESTS="16",
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
