"""Inference.GetServerInfo, GetLoad and WatchLoad on the whole server over the synthetic engine:
what a router reads of a replica, and the same figures in the metrics scrape."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
import pytest_asyncio
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from services.api.server import MmgateServer
from services.client import Credentials, MmgateClient, build_request
from services.client.credentials import channel_options
from services.client.requests import error_reason
from services.proto.mmgate.v1 import inference_pb2 as pb
from tests.services.api.synthetic_server import client_of, synthetic_server
from tests.services.auth.support import TOKENS
from tests.services.prom import scrape
from tests.support import eventually

pytestmark = pytest.mark.asyncio(loop_scope="module")

RUNS = 3
WATCHERS_PER_TENANT = 4  # MMGATE_LOAD__MAX_WATCHERS_PER_TENANT's default
IDLE_SECONDS = 1.0
# a client that takes at most 1 KiB unread: loads wait for it within a few
NO_READER = [("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", 1024)]


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def loaded(
    tiny_model: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[tuple[MmgateServer, InMemorySpanExporter]]:
    async with synthetic_server(
        tiny_model,
        tmp_path_factory.mktemp("load"),
        step_seconds=0.005,
        replica="replica-b",
        max_concurrent_requests=40,
        tenants={"scheduling": {"alpha": {"max_priority": 3}}},
        # two tenants' shares fill the replica's WatchLoad streams; a client that stops
        # reading is ended a second after a load waits for it
        load={"max_watchers": 2 * WATCHERS_PER_TENANT, "watch_idle_seconds": IDLE_SECONDS},
    ) as started:
        yield started


async def test_server_info_names_the_replica_and_its_limits(
    loaded: tuple[MmgateServer, InMemorySpanExporter],
) -> None:
    server, _ = loaded
    async with client_of(server) as client:
        info = await client.server_info()
        model = await client.model_info()
    assert info.replica == "replica-b"
    assert info.version
    assert info.model == model.model
    assert info.max_model_len == model.max_model_len
    assert info.media_mode == model.media_mode
    assert info.max_concurrent_requests == 40
    assert info.engine_slots > 0


async def test_the_load_counts_what_runs_and_agrees_with_the_scrape(
    loaded: tuple[MmgateServer, InMemorySpanExporter],
) -> None:
    server, _ = loaded
    long: dict[str, Any] = {"max_tokens": 2000, "ignore_eos": True, "temperature": 0.0}
    async with client_of(server, TOKENS["alpha"]) as alpha, client_of(server) as reader:
        streams = [
            alpha.generate(build_request(f"Long story {k}", priority=k % 2, **long))
            for k in range(RUNS)
        ]
        for stream in streams:
            assert (await anext(stream)).HasField("delta")
        load = await reader.load()
        scraped = await scrape(f"http://127.0.0.1:{server.metrics.port}/metrics")
        for stream in streams:
            await stream.aclose()
    assert load.ready
    assert load.engine_running == RUNS
    assert load.requests_in_progress == RUNS  # the reader's GetLoad is not admitted work
    assert load.request_headroom == 40 - RUNS
    assert load.queue_waiting == 0
    assert [(p.priority, p.slots_running, p.waiting) for p in load.priorities] == [
        (0, 2, 0),
        (1, 1, 0),
    ]
    stages = {s.stage: (s.entries, s.bytes) for s in load.cache}
    assert stages["prompt"][0] >= RUNS
    assert load.cache_bytes == sum(b for _, b in stages.values())
    assert {p.pool for p in load.media} == {"hash", "decode", "encode", "render"}
    # the scrape, taken while the same runs ran, says the same
    assert scraped.value("mmgate_load_running_requests") == load.engine_running
    assert scraped.value("mmgate_load_waiting_requests") == load.queue_waiting + load.engine_waiting
    assert scraped.value("mmgate_load_request_headroom") == load.request_headroom
    for stage, (entries, held) in stages.items():
        assert scraped.value("mmgate_load_cache_entries", stage=stage) == entries
        assert scraped.value("mmgate_load_cache_bytes", stage=stage) == held


async def test_watch_load_streams_until_the_caller_leaves_and_refuses_bad_intervals(
    loaded: tuple[MmgateServer, InMemorySpanExporter],
) -> None:
    server, _ = loaded
    async with client_of(server) as client:
        call = client.inference.WatchLoad(
            pb.WatchLoadRequest(interval_ms=100), timeout=30, metadata=client.metadata
        )
        seen = [await call.read() for _ in range(3)]
        call.cancel()
        assert seen[0].unix_seconds < seen[1].unix_seconds < seen[2].unix_seconds
        for interval in (99, 60_001):
            bad = client.inference.WatchLoad(
                pb.WatchLoadRequest(interval_ms=interval), timeout=10, metadata=client.metadata
            )
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await bad.read()
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert caught.value.details() == f"interval_ms: {interval}: must be 100 to 60000"

    await no_watchers_left(server)


async def read_to_end(call: Any, into: list[pb.Load]) -> None:
    while True:
        into.append(await call.read())


async def no_watchers_left(server: MmgateServer) -> None:
    async def none_left() -> bool:
        return server.load.watchers == 0

    await eventually(none_left, timeout=10)


async def watching(client: MmgateClient, count: int) -> list[Any]:
    """``count`` WatchLoad streams of ``client``'s tenant, each past its first load."""
    calls = []
    for _ in range(count):
        call = client.inference.WatchLoad(
            pb.WatchLoadRequest(interval_ms=60_000), timeout=30, metadata=client.metadata
        )
        await call.read()
        calls.append(call)
    return calls


async def refused_watch(client: MmgateClient) -> grpc.aio.AioRpcError:
    """The RESOURCE_EXHAUSTED a WatchLoad of ``client``'s ends with at once."""
    call = client.inference.WatchLoad(pb.WatchLoadRequest(), timeout=10, metadata=client.metadata)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call.read()
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    return caught.value


async def test_watch_load_streams_past_the_replicas_limit_are_refused(
    loaded: tuple[MmgateServer, InMemorySpanExporter],
) -> None:
    server, _ = loaded
    async with (
        client_of(server, TOKENS["alpha"]) as alpha,
        client_of(server, TOKENS["beta"]) as beta,
        client_of(server, TOKENS["ops"]) as ops,
    ):
        calls = [
            *await watching(alpha, WATCHERS_PER_TENANT),
            *await watching(beta, WATCHERS_PER_TENANT),
        ]
        error = await refused_watch(ops)
        assert f"{2 * WATCHERS_PER_TENANT} WatchLoad streams are open" in error.details()
        for call in calls:
            call.cancel()
        assert (await ops.load()).ready  # polling still answers

    await no_watchers_left(server)


async def test_one_tenant_holds_at_most_its_share_of_the_watch_load_streams(
    loaded: tuple[MmgateServer, InMemorySpanExporter],
) -> None:
    """A greedy tenant's streams cannot keep another tenant's router from watching."""
    server, _ = loaded
    async with (
        client_of(server, TOKENS["alpha"]) as alpha,
        client_of(server, TOKENS["beta"]) as beta,
    ):
        calls = await watching(alpha, WATCHERS_PER_TENANT)
        error = await refused_watch(alpha)
        assert error.details() == (
            f"tenant alpha has {WATCHERS_PER_TENANT} WatchLoad streams open, its limit;"
            " close one first"
        )
        assert error_reason(error) == "TENANT_OVERLOADED"
        calls += await watching(beta, 1)
        for call in calls:
            call.cancel()

    await no_watchers_left(server)


async def test_a_load_watcher_that_reads_nothing_is_ended(
    loaded: tuple[MmgateServer, InMemorySpanExporter],
) -> None:
    """A client that stops reading: once a load has waited IDLE_SECONDS to be written to it,
    its slot is given back and its stream ends, after what it was sent, with
    RESOURCE_EXHAUSTED in mmgate's words."""
    server, _ = loaded
    target = f"127.0.0.1:{server.port}"
    channel = grpc.aio.insecure_channel(
        target, options=[*channel_options(retries=False), *NO_READER]
    )
    credentials = Credentials(token=TOKENS["beta"])
    async with MmgateClient(target, credentials=credentials, channel=channel) as reader:
        call = reader.inference.WatchLoad(
            pb.WatchLoadRequest(interval_ms=100), timeout=120, metadata=reader.metadata
        )
        await call.read()
        assert server.load.watchers == 1

        async def given_back() -> bool:
            return server.load.watchers == 0

        # nothing read meanwhile: the loads fill the client's window, then one waits
        await eventually(given_back, timeout=60)
        sent: list[pb.Load] = []
        with pytest.raises(grpc.aio.AioRpcError) as ended:
            await read_to_end(call, sent)
        assert ended.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert ended.value.details() == (
            f"this WatchLoad stream read nothing for {IDLE_SECONDS:g} s while a load waited for"
            " it: its stream ends; watch again, or poll GetLoad"
        )
        assert sent

    await no_watchers_left(server)
