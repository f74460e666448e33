"""SIGTERM: health turns NOT_SERVING, new calls are refused, in-flight streams finish within the
grace period, then everything closes and the process exits cleanly.

It stops the session's server (tests/services/conftest.py), after every other test has used it.
"""

import asyncio
import os
import signal
from pathlib import Path

import grpc
import pytest

from services.client import MmgateClient, build_request
from tests.support import RunningServer


def children_of(pid: int) -> set[int]:
    found: set[int] = set()
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(
                line.split(":\t", 1) for line in status.read_text().splitlines() if ":\t" in line
            )
        except OSError:
            continue
        if fields.get("PPid", "").strip() == str(pid):
            found.add(int(status.parent.name))
    return found


# tokens the in-flight request asks for: more than a 1 KiB stream window holds as messages
DRAIN_TOKENS = 1000


@pytest.mark.ends_server
async def test_sigterm_drains_and_exits(server: RunningServer) -> None:
    try:
        await _drain(server)
    finally:
        if server.process.poll() is None:  # a failure above: leave no server behind
            os.killpg(server.process.pid, signal.SIGKILL)
            server.process.wait(timeout=30)


async def _drain(server: RunningServer) -> None:
    # the port opens before the engine is ready: NOT_SERVING first, then SERVING
    assert server.startup_statuses[0] == _NOT_SERVING
    assert server.startup_statuses[-1] == 1  # SERVING
    assert children_of(server.process.pid)  # the engine core runs in a child process
    # The in-flight stream lasts until this test reads it: a stream window of 1 KiB holds the
    # server's writes once that much is unread. Without it a fast host generated all 1,000
    # tokens before the drain began, and the server, rightly, stopped at once.
    channel = grpc.aio.insecure_channel(
        server.target,
        options=[("grpc.http2.lookahead_bytes", 1024), ("grpc.http2.bdp_probe", 0)],
    )
    async with MmgateClient(server.target, timeout=120, channel=channel) as client:
        request = build_request(
            "Drain me", max_tokens=DRAIN_TOKENS, ignore_eos=True, temperature=0.0
        )
        stream = aiter(client.generate(request))
        events = [await anext(stream)]  # in flight

        # what the server logs from here on: earlier tests' calls are not this shutdown's
        logged = server.log_path.stat().st_size
        server.process.send_signal(signal.SIGTERM)
        watch = aiter(client.health_stub.Watch(_health_request(), timeout=30))
        statuses = [(await anext(watch)).status]
        while statuses[-1] != _NOT_SERVING:
            statuses.append((await anext(watch)).status)

        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await client.complete("Too late", max_tokens=1)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        # refused by a server still draining this stream, not by one already gone
        assert server.process.poll() is None

        events += [event async for event in stream]  # the in-flight stream completes
    final = events[-1].final
    assert final.usage.completion_tokens == DRAIN_TOKENS

    exit_code = await asyncio.to_thread(server.process.wait, 90)
    assert exit_code == 0, server.log()
    with server.log_path.open("rb") as whole:
        whole.seek(logged)
        log = whole.read().decode(errors="replace")
    assert "stopped" in log
    # a clean shutdown: no engine error on the way out (mmgate stops using the engine first)
    for noise in ("Traceback", "EngineDeadError", "output_handler failed"):
        assert noise not in log, log
    assert children_of(server.process.pid) == set()


def _health_request() -> object:
    from grpc_health.v1 import health_pb2

    return health_pb2.HealthCheckRequest(service="")


_NOT_SERVING = 2  # grpc.health.v1.HealthCheckResponse.NOT_SERVING
