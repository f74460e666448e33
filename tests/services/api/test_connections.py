"""Connections as clients, Kubernetes and Redis treat them: keepalive pings, connection age, a
second tier that refuses mmgate's credentials.

- A client with aggressive keepalive (a ping every second, with or without calls, as Go and Java
  clients and proxies are often set up) keeps a unary call that sends nothing for 20 s and more,
  and an idle channel, without a GOAWAY "too_many_pings" (grpc's own defaults cut it at ~5 s).
- A Redis URL with a wrong password is logged at start (one authenticated round trip), and
  mmgate serves without the tier.
- Behind a per-connection TCP balancer (HAProxy ``mode tcp``, as kube-proxy balances a Service),
  a pick_first client stays on its first replica for ever; with MMGATE_CONNECTIONS__MAX_AGE_SECONDS
  on that replica, its connection is closed now and then, and a new one can reach a replica
  started after the client connected.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from services.client import MmgateClient, build_request
from services.proto.mmgate.v1 import cache_pb2, inference_pb2_grpc
from tests.haproxy import TcpProxy
from tests.redis_support import RedisProcess, redis_server
from tests.services.prom import scrape
from tests.support import RunningServer, eventually, free_port, start_server

pytestmark = pytest.mark.asyncio(loop_scope="module")

SLOW_SECONDS = 21.0  # a unary call that sends nothing this long: four times the 5 s it died at
SLOW_TENANT = "slow"
MAX_AGE_SECONDS = 2.0
AGGRESSIVE = [
    ("grpc.keepalive_time_ms", 1000),
    ("grpc.keepalive_timeout_ms", 5000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
]
GET_STATS = "/mmgate.v1.Cache/GetStats"
WRONG = "not-the-password"  # the aged replica's Redis password; the server's is another


class Fleet:
    """The module's servers beyond the session's, each started on first use: the connection-age
    test starts the slow one while its client is connected to the aged one."""

    def __init__(self, tiny_model: str, directory: Path, guarded_redis: RedisProcess) -> None:
        self.tiny_model, self.directory = tiny_model, directory
        self.guarded_redis = guarded_redis
        self.servers: list[RunningServer] = []
        self._aged: RunningServer | None = None
        self._slow: RunningServer | None = None

    def start(self, **settings: str) -> RunningServer:
        # connections, keepalive and the start's checks are the front's: the synthetic engine
        server = start_server(
            self.directory, self.tiny_model, MMGATE_ENGINE__SYNTHETIC="{}", **settings
        )
        self.servers.append(server)
        return server

    def aged(self) -> RunningServer:
        """Connections closed after MAX_AGE_SECONDS; its Redis URL has a wrong password (the
        start check's test reads its log)."""
        if self._aged is None:
            self._aged = self.start(
                MMGATE_CONNECTIONS__MAX_AGE_SECONDS=str(MAX_AGE_SECONDS),
                MMGATE_CONNECTIONS__MAX_AGE_GRACE_SECONDS="60",
                MMGATE_REDIS__URL=f"redis://:{WRONG}@127.0.0.1:{self.guarded_redis.port}/0",
            )
        return self._aged

    def slow(self, port: int | None = None) -> RunningServer:
        """The engine held SLOW_SECONDS before each request of tenant "slow" (fault
        injection's "slow": the call then finishes normally); connections never aged."""
        if self._slow is None:
            self._slow = self.start(
                **({} if port is None else {"MMGATE_PORT": str(port)}),
                MMGATE_CHAOS__ENABLED="true",
                MMGATE_CHAOS__SLOW_SECONDS=str(SLOW_SECONDS),
                MMGATE_CHAOS__TENANTS=json.dumps({SLOW_TENANT: {"engine": {"slow": 1.0}}}),
            )
        return self._slow


@pytest.fixture(scope="module")
def fleet(tiny_model: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    directory = tmp_path_factory.mktemp("connections")
    guarded = redis_server(directory, password="s3cret")
    servers = Fleet(tiny_model, directory, guarded)
    try:
        yield servers
    finally:
        for server in servers.servers:
            if server.process.poll() is None:
                assert server.stop() == 0, server.log()
        guarded.stop()


async def calls_served(server: RunningServer) -> float:
    return (await scrape(server.metrics_url)).total("mmgate_grpc_requests_total", method=GET_STATS)


async def test_with_a_connection_age_a_client_reaches_a_replica_started_after_it(
    fleet: Fleet, tmp_path_factory: pytest.TempPathFactory
) -> None:
    first = fleet.aged()
    second_port = free_port()
    proxy = TcpProxy(tmp_path_factory.mktemp("kube-proxy"), [first.port, second_port]).start()
    try:
        async with MmgateClient(proxy.target, timeout=30.0) as client:
            await client.cache.GetStats(cache_pb2.GetStatsRequest(), timeout=30)
            # the second replica starts while the client is connected to the first
            second = await asyncio.to_thread(fleet.slow, second_port)

            async def second_served() -> bool:
                await client.cache.GetStats(cache_pb2.GetStatsRequest(), timeout=30)
                return await calls_served(second) > 0

            await eventually(second_served, timeout=10 * MAX_AGE_SECONDS, interval=0.1)
        assert await calls_served(first) > 0
    finally:
        proxy.stop()


async def test_a_wrong_redis_password_is_logged_at_start_and_mmgate_serves_without_the_tier(
    fleet: Fleet,
) -> None:
    # the connection to Redis: one authenticated round trip at start, a warning when it fails
    server = fleet.aged()  # start_server returned: health said SERVING
    log = server.log_path.read_text(errors="replace")
    warning = (
        "second tier: Redis refused the credentials; serving without it until it answers "
        "(every lookup is a miss)"
    )
    assert log.count(warning) == 1, server.log()
    assert WRONG not in log
    async with server.client(timeout=60.0) as client:
        answer = await client.complete_request(build_request("Say hello.", max_tokens=4))
    assert answer.final.usage.completion_tokens >= 1


async def test_an_aggressive_keepalive_client_keeps_a_long_call_and_an_idle_channel(
    fleet: Fleet,
) -> None:
    slow_server = fleet.slow()

    async def long_unary() -> float:
        async with grpc.aio.insecure_channel(slow_server.target, options=AGGRESSIVE) as channel:
            stub = inference_pb2_grpc.InferenceStub(channel)
            started = time.monotonic()
            response = await stub.Complete(
                build_request("Count slowly", max_tokens=4, temperature=0.0),
                metadata=(("x-mmgate-tenant", SLOW_TENANT),),
                timeout=120,
            )
            assert len(response.token_ids) >= 1
            return time.monotonic() - started

    async def idle_channel() -> grpc.ChannelConnectivity:
        async with grpc.aio.insecure_channel(slow_server.target, options=AGGRESSIVE) as channel:
            await channel.channel_ready()
            # a GOAWAY closes the connection: the channel leaves READY
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(
                    channel.wait_for_state_change(grpc.ChannelConnectivity.READY), SLOW_SECONDS
                )
            return channel.get_state()

    took, state = await asyncio.gather(long_unary(), idle_channel())
    assert took >= SLOW_SECONDS
    assert state == grpc.ChannelConnectivity.READY


async def test_without_a_connection_age_a_client_stays_on_its_first_replica(
    server: RunningServer, fleet: Fleet, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # both replicas up all along, neither aging its connections: only one of them serves
    replicas = [server, fleet.slow()]
    proxy = TcpProxy(tmp_path_factory.mktemp("kube-proxy"), [r.port for r in replicas]).start()
    try:
        before = [await calls_served(r) for r in replicas]
        async with MmgateClient(proxy.target, timeout=30.0) as client:
            ends = time.monotonic() + 3 * MAX_AGE_SECONDS
            while time.monotonic() < ends:
                await client.cache.GetStats(cache_pb2.GetStatsRequest(), timeout=30)
        served = [await calls_served(r) - b for r, b in zip(replicas, before, strict=True)]
    finally:
        proxy.stop()
    assert sorted(served)[0] == 0
    assert sorted(served)[1] > 0
