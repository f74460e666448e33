"""Helpers shared by the tests and the benchmarks: sequencing without sleeps, ports, servers.

until(predicate)          yield to the loop until a condition holds (progress, not time)
Gate, Stuck               computations held until released / never finishing by themselves
assert_no_leaked_tasks()  nothing left running on the loop but the caller
free_port()               a loopback port nobody listens on
wait_serving(target)      block until a server's health says SERVING (Watch: no polling)
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

SERVING = health_pb2.HealthCheckResponse.SERVING


async def until(predicate: Callable[[], bool], limit: int = 10_000) -> None:
    """Yield to the loop until ``predicate`` holds: waits on progress, not on time."""
    for _ in range(limit):
        if predicate():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition never held")


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


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_serving(target: str, timeout: float, service: str = "") -> list[int]:
    """Block until ``target``'s health for ``service`` says SERVING; the statuses seen on the way.

    Raises grpc.FutureTimeoutError when the port never opens, grpc.RpcError when the stream
    fails (the server exited, or ``timeout`` passed), AssertionError when it ends before SERVING.
    """
    seen: list[int] = []
    with grpc.insecure_channel(target) as channel:
        grpc.channel_ready_future(channel).result(timeout=timeout)
        stream = health_pb2_grpc.HealthStub(channel).Watch(
            health_pb2.HealthCheckRequest(service=service), timeout=timeout
        )
        for update in stream:
            seen.append(update.status)
            if update.status == SERVING:
                stream.cancel()
                return seen
    raise AssertionError(f"the health stream of {target} ended before SERVING")
