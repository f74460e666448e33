"""Leaving early, by cancellation or by deadline, aborts the engine request at once."""

import grpc
import pytest

from services.client import MmgateClient, build_request
from services.proto.mmgate.v1 import cache_pb2
from tests.services.prom import scrape
from tests.support import (
    RunningServer,
    engine_core,
    engine_in_flight,
    eventually,
    hand_to_stopped_core,
)


async def settled_engine(client: MmgateClient, ticks: int = 5) -> cache_pb2.EngineCacheStats:
    """Engine stats once the engine has stepped with nothing left running: a short request
    forces a step, and vLLM's stats of a step can still count an abort it takes at the next."""
    for _ in range(ticks):
        await client.complete("tick", max_tokens=1)
        stats = (await client.stats()).engine
        if stats.running == 0:
            break
    return stats


@pytest.mark.parametrize("samples", [1, 4])
async def test_cancelled_stream_aborts_the_engine_request(
    server: RunningServer, client: MmgateClient, samples: int
) -> None:
    """The call is cancelled while its engine request is open: the engine stops it short of its
    900 tokens. The core is stopped while the request is handed to it and cancelled, so that
    the cancellation lands before the run's end however fast the core runs (on a loaded 2-core
    host the tiny model's core made all 900 tokens before the server had relayed the first, 20
    tries in a row). Four samples are four sequences in the engine: the cancellation ends all."""
    request = build_request(
        "Long story",
        max_tokens=900,
        ignore_eos=True,
        temperature=0.0 if samples == 1 else 1.0,
        n=samples if samples > 1 else None,
    )
    before = await settled_engine(client)
    generated = (await scrape(server.metrics_url)).value("mmgate_engine_generation_tokens_total")
    core = engine_core(server)
    assert core is not None, server.log()
    try:
        call = await hand_to_stopped_core(core, client, request)
        call.cancel()
        await eventually(engine_in_flight(client, 0), timeout=30)  # mmgate has let go of it
    finally:
        core.resume()

    after = await settled_engine(client)
    assert after.running == 0
    assert after.aborted == before.aborted + 1
    made = (await scrape(server.metrics_url)).value("mmgate_engine_generation_tokens_total")
    # the ticks' single tokens, and whatever the core made before it read the abort
    assert made - generated < 900 * samples, (generated, made)


def quiet_since(server: RunningServer, offset: int) -> None:
    """A call whose caller has gone ends without a word in the log: no traceback from a status
    sent to a call gRPC has already finished (ExecuteBatchError)."""
    added = server.log_path.read_bytes()[offset:].decode(errors="replace")
    assert "Traceback" not in added, added[-3000:]
    assert "ExecuteBatchError" not in added, added[-3000:]


async def test_deadline_exceeded_aborts_the_engine_request(
    server: RunningServer, client: MmgateClient
) -> None:
    offset = server.log_path.stat().st_size
    before = await settled_engine(client)
    request = build_request("Long story", max_tokens=900, ignore_eos=True, temperature=0.0)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        # 900 tokens take the tiny model ~0.5 s on an idle 2-core machine: 0.2 s cannot hold them
        async for _ in client.generate(request, timeout=0.2):
            pass
    assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    after = await settled_engine(client)
    assert after.aborted == before.aborted + 1
    assert after.running == 0
    quiet_since(server, offset)


async def test_a_unary_call_past_its_deadline_aborts_its_final_only_run(
    server: RunningServer, client: MmgateClient
) -> None:
    """A unary call's run sends nothing before its end: leaving still aborts it at once."""
    offset = server.log_path.stat().st_size
    before = await settled_engine(client)
    request = build_request(
        "Long story", max_tokens=900, ignore_eos=True, temperature=1.0, n=2, cache_policy="bypass"
    )
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await client.complete_request(request, timeout=0.2)
    assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    after = await settled_engine(client)
    assert after.aborted == before.aborted + 1
    assert after.running == 0
    quiet_since(server, offset)
