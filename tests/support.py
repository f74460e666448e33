"""Helpers shared by the tests and the benchmarks: sequencing without sleeps, ports, servers.

until(predicate)          yield to the loop until a condition holds (progress, not time)
Gate, Stuck               computations held until released / never finishing by themselves
Clock                     a clock a test moves by hand
assert_no_leaked_tasks()  nothing left running on the loop but the caller
hand_to_stopped_core()    a request in flight in an engine core that cannot step
free_port()               a loopback port nobody listens on
wait_serving(target)      block until a server's health says SERVING (Watch: no polling)
start_server(dir, model)  `mmgate serve` in a child process on free ports, until SERVING
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import psutil
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.client import Credentials, MmgateClient

SERVING = health_pb2.HealthCheckResponse.SERVING


async def until(predicate: Callable[[], bool], limit: int = 10_000) -> None:
    """Yield to the loop until ``predicate`` holds: waits on progress, not on time."""
    for _ in range(limit):
        if predicate():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition never held")


async def eventually(
    predicate: Callable[[], Awaitable[bool]], timeout: float, interval: float = 0.05
) -> float:
    """Poll another process's state until ``predicate`` holds; the seconds it took.

    For state this process cannot wait on (a server's health, its stats): polling with a
    deadline, never a sleep that stands in for an event.
    """
    started = time.monotonic()
    while not await predicate():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"condition did not hold within {timeout:g} s")
        await asyncio.sleep(interval)
    return time.monotonic() - started


def engine_in_flight(client: MmgateClient, count: int) -> Callable[[], Awaitable[bool]]:
    """For :func:`eventually`: the server has ``count`` requests open in its engine (by its own
    bookkeeping, which holds while the engine core is stopped)."""

    async def check() -> bool:
        return (await client.stats()).engine_health.in_flight == count

    return check


async def hand_to_stopped_core(
    core: psutil.Process, client: MmgateClient, request: Any, timeout: float | None = None
) -> Any:
    """The engine core stopped (SIGSTOP), then ``request`` sent: its Generate call, once the server
    has it in flight. The engine owes a step from then on, however fast the core would have run
    it; on a loaded 2-core host the tiny model's core can finish 900 tokens before the server
    relays the first. The caller resumes the core (``core.resume()``), in a ``finally``."""
    core.suspend()
    call = client.inference.Generate(request, timeout=timeout)
    await eventually(engine_in_flight(client, 1), timeout=30)
    return call


def assert_no_leaked_tasks() -> None:
    current = asyncio.current_task()
    leaked = [t for t in asyncio.all_tasks() if t is not current and not t.done()]
    assert leaked == []


class Gate:
    """A computation that blocks until released and counts its calls (sequencing, not sleeps)."""

    def __init__(self, value: Any = b"value") -> None:
        self.value = value
        self.calls = 0
        self.started = asyncio.Event()
        self.release = asyncio.Event()

    async def __call__(self) -> Any:
        self.calls += 1
        self.started.set()
        await self.release.wait()
        return self.value


class Clock:
    """A clock that moves only when a test moves it (``now``): durations without waiting."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Stuck:
    """A computation that never finishes by itself and records that it was cancelled."""

    def __init__(self) -> None:
        self.cancelled = asyncio.Event()

    async def __call__(self) -> bytes:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        return b"never"


def installed(program: str) -> str:
    """A Debian program's path (``make proxies`` installs nginx and haproxy): on PATH, or in
    /usr/sbin, which a non-root PATH may lack."""
    found = shutil.which(program) or shutil.which(program, path="/usr/sbin")
    assert found, f"{program} is missing: `make proxies` installs Debian's {program}"
    return found


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_serving(
    target: str,
    timeout: float,
    service: str = "",
    credentials: Credentials | None = None,
    alive: Callable[[], bool] | None = None,
) -> list[int]:
    """Block until ``target``'s health for ``service`` says SERVING; the statuses seen on the way.

    A watch the server cut while ``alive()`` still holds (a connection past its maximum age, on a
    busy machine) is watched again. Raises grpc.FutureTimeoutError when the port never opens,
    grpc.RpcError when the stream fails (the server exited, or ``timeout`` passed),
    AssertionError when it ends before SERVING.
    """
    seen: list[int] = []
    deadline = time.monotonic() + timeout
    while True:
        left = max(0.0, deadline - time.monotonic())
        with (credentials or Credentials()).channel(target) as channel:
            grpc.channel_ready_future(channel).result(timeout=left)
            stream = health_pb2_grpc.HealthStub(channel).Watch(
                health_pb2.HealthCheckRequest(service=service), timeout=left
            )
            try:
                for update in stream:
                    seen.append(update.status)
                    if update.status == SERVING:
                        stream.cancel()
                        return seen
            except grpc.RpcError as error:
                cut = error.code() == grpc.StatusCode.UNAVAILABLE
                if not (cut and alive is not None and alive() and time.monotonic() < deadline):
                    raise
                continue
        raise AssertionError(f"the health stream of {target} ended before SERVING")


ROOT = Path(__file__).resolve().parents[1]
# engines started during the run, by where (tests/conftest.py prints them at the end)
ENGINE_STARTS: Counter[str] = Counter()
START_TIMEOUT = 240.0
STOP_TIMEOUT = 90.0
# the shared tiny LLaVA server's shutdown grace (tests/conftest.py), which the drain suite measures
LLAVA_GRACE_SECONDS = 30
MiB = 1024 * 1024


@dataclass
class RunningServer:
    process: subprocess.Popen[bytes]
    port: int
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    # health of "" as seen from the moment the port opened until SERVING
    startup_statuses: list[int] = field(default_factory=list)
    # what its clients connect with (TLS, a client certificate, a token) by default
    credentials: Credentials | None = None

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def log(self, lines: int = 60) -> str:
        text = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    @property
    def metrics_url(self) -> str:
        """The /metrics address the server logged at start (its metrics port may be any)."""
        found = re.search(r"metrics on (http://\S+/metrics)", self.log_path.read_text("utf-8"))
        assert found is not None, f"no metrics address in the server's log:\n{self.log()}"
        return found.group(1)

    def client(self, **kwargs: object) -> MmgateClient:
        kwargs.setdefault("credentials", self.credentials)
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


def start_server(
    log_dir: Path, model: str | None, credentials: Credentials | None = None, /, **settings: str
) -> RunningServer:
    """``mmgate serve`` with ``settings`` (MMGATE_* variables), SERVING; ``credentials``: what
    its clients connect with (TLS, a client certificate, a token) unless told otherwise; a
    port of the caller's choosing as MMGATE_PORT."""
    port = int(settings.get("MMGATE_PORT") or free_port())
    if "MMGATE_ENGINE__SYNTHETIC" not in settings:  # the synthetic engine starts no model
        ENGINE_STARTS["mmgate serve"] += 1
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
    server = RunningServer(process, port, log_path, env, credentials=credentials)
    try:
        wait_until_serving(server)
    except BaseException:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)
        raise
    return server


def engine_core(server: RunningServer) -> psutil.Process | None:
    """The server's vLLM engine core process (a spawned child), if it is still there."""
    try:
        children = psutil.Process(server.process.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return None
    for child in children:
        try:
            command = " ".join(child.cmdline())
            title = child.name()
        except psutil.Error:
            continue
        if "EngineCore" in title or "EngineCore" in command:
            return child
    for child in children:  # without setproctitle: the spawned child that is no helper
        try:
            command = " ".join(child.cmdline())
        except psutil.Error:
            continue
        if "spawn_main" in command and "resource_tracker" not in command:
            return child
    return None


def wait_until_serving(server: RunningServer) -> None:
    """Block until the server's health says SERVING; its log in the failure if it never does."""
    try:
        server.startup_statuses.extend(
            wait_serving(
                server.target,
                START_TIMEOUT,
                credentials=server.credentials,
                alive=lambda: server.process.poll() is None,
            )
        )
    except (grpc.FutureTimeoutError, grpc.RpcError, AssertionError) as error:
        raise AssertionError(
            f"server did not become ready ({error!r}); exit code {server.process.poll()}:\n"
            f"{server.log()}"
        ) from None


def slow_schema(properties: int) -> dict[str, Any]:
    """A JSON schema the engine takes seconds to compile: ``properties`` strings of distinct
    length bounds (xgrammar here: 60 take seconds, 400 over a minute). Names of its own each
    time, as the engine keeps the grammars it compiled."""
    names = [f"{uuid.uuid4().hex[:6]}{i}" for i in range(properties)]
    fields = {
        name: {"type": "string", "minLength": i % 7, "maxLength": 900 + i}
        for i, name in enumerate(names)
    }
    return {"type": "object", "properties": fields, "required": names}


async def run_cli(target: str, *args: str) -> str:
    """``mmgate ARGS --target TARGET`` in a child process (this test's loop serves an in-process
    server meanwhile): what it printed; a failure shows its stderr."""
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "services.cli",
        *args,
        "--target",
        target,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(child.communicate(), 120)
    assert child.returncode == 0, err.decode()[-2000:]
    return out.decode()
