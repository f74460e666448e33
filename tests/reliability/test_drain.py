"""Drain: SIGTERM while 32 streams run and 16 requests wait on shared responses. Every stream
ends with its whole result (or UNAVAILABLE) within the grace period, calls after the signal get
UNAVAILABLE, and the process exits 0."""

from __future__ import annotations

import asyncio
import signal
import time
import uuid

import grpc
import pytest

from services.client import MmgateClient, build_request
from tests.support import RunningServer

from .conftest import GRACE_SECONDS, record

STREAMS = 32
SHARED = 16  # four runs, four listeners each
MAX_TOKENS = 200


async def stream(client: MmgateClient, prompt: str, policy: str, started: asyncio.Event) -> str:
    request = build_request(
        prompt, max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True, cache_policy=policy
    )
    tokens = 0
    try:
        async for event in client.generate(request, timeout=120):
            if event.HasField("delta"):
                tokens += len(event.delta.token_ids)
                started.set()
            elif event.final.usage.completion_tokens != MAX_TOKENS or tokens != MAX_TOKENS:
                return "TRUNCATED"  # an OK stream must hold its whole answer
    except grpc.aio.AioRpcError as error:
        started.set()
        return str(error.code().name)
    return "OK"


@pytest.mark.ends_server
async def test_sigterm_under_load_loses_nothing(llava_server: RunningServer) -> None:
    server = llava_server
    async with server.client(timeout=120.0, retries=False) as client:
        tag = uuid.uuid4().hex[:8]
        prompts = [(f"Drain {tag} stream {i}", "prompt") for i in range(STREAMS)]
        prompts += [(f"Drain {tag} shared {i % 4}", "response") for i in range(SHARED)]
        started = [asyncio.Event() for _ in prompts]
        calls = [
            asyncio.ensure_future(stream(client, prompt, policy, event))
            for (prompt, policy), event in zip(prompts, started, strict=True)
        ]
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), 120)

        signalled = time.monotonic()
        server.process.send_signal(signal.SIGTERM)

        async def refused() -> bool:
            try:
                await client.complete("Too late", max_tokens=1, timeout=5)
            except grpc.aio.AioRpcError as error:
                late.append(str(error.code().name))
                return bool(error.code() == grpc.StatusCode.UNAVAILABLE)
            late.append("OK")
            return False

        late: list[str] = []
        while not await refused() and time.monotonic() - signalled < GRACE_SECONDS:
            pass  # each try is one call: the server accepts calls until the signal lands
        codes = await asyncio.gather(*calls)
        ended = time.monotonic() - signalled
    exit_code = await asyncio.to_thread(server.process.wait, 90)
    exited = time.monotonic() - signalled
    counted = {code: codes.count(code) for code in sorted(set(codes))}
    record(
        "drain",
        {
            "streams": STREAMS,
            "shared": SHARED,
            "grace_seconds": GRACE_SECONDS,
            "codes": counted,
            "late_codes": {code: late.count(code) for code in sorted(set(late))},
            "streams_ended_seconds": round(ended, 2),
            "exit_seconds": round(exited, 2),
            "exit_code": exit_code,
        },
    )
    assert set(codes) <= {"OK", "UNAVAILABLE"}, counted
    assert ended < GRACE_SECONDS + 5
    assert late[-1] == "UNAVAILABLE"
    assert exit_code == 0, server.log()
    for noise in ("Traceback", "EngineDeadError"):
        assert noise not in server.log(500)
