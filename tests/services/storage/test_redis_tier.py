"""The Redis tier against real redis-server processes, through the real cache actor: values shared
between two actors (two replicas), bad bytes under mmgate's keys and values copied under another
key or tenant read as counted misses, a killed and a stopped Redis never failing a lookup,
invalidations reaching the other replica, a Cluster, a password, an ACL user and TLS, and the
start check telling a wrong password or an unreachable Redis in a line."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from cache_actor import CacheActor, CacheConfig, Outcome, Stage, TierUse
from services.config import RedisSettings
from services.engine.values import seal, seal_json, unseal_json
from services.storage.redis_tier import RedisTier, redis_address, redis_client, redis_weaknesses
from tests.redis_support import (
    RedisProcess,
    redis_cluster,
    redis_server,
    tls_redis_server,
)
from tests.support import eventually, free_port

STAGE = TierUse(Stage.RESPONSE)


class JsonCodec:
    def __init__(self, secret: bytes | None = None) -> None:
        self.secret = secret

    def encode(self, value: Any, key: str) -> bytes:
        return seal_json("response", value, key=key, secret=self.secret)

    def decode(self, data: bytes, key: str) -> Any:
        return unseal_json(data, "response", key=key, secret=self.secret)


def tier_for(
    url: str, *, cluster: bool = False, secret: bytes | None = None, **settings: Any
) -> RedisTier:
    redis = RedisSettings(url=url, cluster=cluster, **{"timeout_seconds": 0.5, **settings})
    return RedisTier(
        redis_client(redis),
        namespace="test",
        codecs={"response": JsonCodec(secret)},
        ttl_seconds={"response": 60},
        max_value_bytes=1 << 20,
        address=redis_address(url),
        timeout_seconds=redis.timeout_seconds,
    )


def actor_for(tier: RedisTier, **config: Any) -> CacheActor:
    settings = {"tier_timeout": 0.5, "tier_breaker_failures": 3, "tier_breaker_seconds": 1.0}
    return CacheActor(CacheConfig(**{**settings, **config}), tier=tier)


def forget_in(actor: CacheActor) -> Callable[[str, str], Awaitable[bool]]:
    """What a replica does when another has invalidated a key: drop its memory copy."""

    def forget(tenant: str, key: str) -> Awaitable[bool]:
        return actor.invalidate(key, tenant=tenant, local=True)

    return forget


class computed:  # a computation, named as the call reads: computed(value)
    """A computation that returns ``value`` and counts its calls."""

    def __init__(self, value: Any) -> None:
        self.value = value
        self.calls: list[int] = []

    async def __call__(self) -> Any:
        self.calls.append(1)
        return self.value


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisProcess]:
    server = redis_server(tmp_path)
    yield server
    server.stop()


async def subscribed(nodes: list[RedisProcess], channel: str, listeners: int) -> None:
    """``listeners`` tiers hear ``channel``'s invalidations (PUBSUB NUMSUB, summed over the
    nodes: in a Cluster each counts the subscribers connected to it)."""

    async def listening() -> bool:
        counts = [node.cli("PUBSUB", "NUMSUB", channel).split()[-1] for node in nodes]
        return sum(int(count) for count in counts) >= listeners

    await eventually(listening, timeout=10)


@pytest.fixture
async def replicas(redis: RedisProcess) -> AsyncIterator[tuple[CacheActor, CacheActor]]:
    """Two actors sharing one Redis, as two replicas do, each listening for the other's
    invalidations."""
    tiers = [tier_for(redis.url), tier_for(redis.url)]
    actors = [actor_for(tier) for tier in tiers]
    for actor, tier in zip(actors, tiers, strict=True):
        actor.start()
        tier.listen(forget_in(actor))
    await subscribed([redis], tiers[0].channel, listeners=2)
    yield actors[0], actors[1]
    for actor, tier in zip(actors, tiers, strict=True):
        await actor.aclose()
        await tier.close()


@pytest.fixture
async def probe(redis: RedisProcess) -> AsyncIterator[RedisTier]:
    """A tier of the test's own, to look at what the replicas wrote."""
    tier = tier_for(redis.url)
    yield tier
    await tier.close()


async def written(tier: RedisTier, *keys: str, tenant: str = "t") -> None:
    """The write-backs of ``keys`` (queued, never waited for) have landed: Redis holds each."""

    async def landed() -> bool:
        names = [tier.redis_key(tenant, "response", key) for key in keys]
        return all([await tier.client.exists(name) for name in names])

    await eventually(landed, timeout=10)


async def test_a_value_computed_by_one_replica_is_served_to_the_other(
    replicas: tuple[CacheActor, CacheActor], probe: RedisTier
) -> None:
    first, second = replicas
    value = {"deltas": [["Paris", [42]]]}
    made = computed(value)
    assert (await first.get("k", made, tenant="t", tier=STAGE)).tier is None
    await written(probe, "k")
    other = computed({"never": "used"})
    lookup = await second.get("k", other, tenant="t", tier=STAGE)
    assert (lookup.value, lookup.outcome, lookup.tier) == (value, Outcome.MISS, "redis")
    assert other.calls == []
    # another tenant's key is another key
    assert (await second.get("k", other, tenant="u", tier=STAGE)).tier is None


async def test_invalidate_on_one_replica_reaches_the_other(
    replicas: tuple[CacheActor, CacheActor], redis: RedisProcess, probe: RedisTier
) -> None:
    first, second = replicas
    await first.get("k", computed("v1"), tenant="t", tier=STAGE)
    await written(probe, "k")
    assert (await second.get("k", computed("x"), tenant="t", tier=STAGE)).tier == "redis"
    assert (await second.get("k", computed("x"), tenant="t", tier=STAGE)).outcome is Outcome.HIT
    assert await first.invalidate("k", tenant="t", stage=Stage.RESPONSE)
    assert redis.cli("KEYS", "mmgate:*") == ""

    async def dropped() -> bool:
        return (await second.inspect("k", tenant="t")).state == "absent"

    await eventually(dropped, timeout=10)  # the other replica forgot its memory copy
    fresh = computed("v2")
    lookup = await second.get("k", fresh, tenant="t", tier=STAGE)
    assert (lookup.value, lookup.outcome, lookup.tier) == ("v2", Outcome.MISS, None)


# the key test_bad_bytes_... reads, as tier_for names it
OURS = "mmgate:test:t:response:k"


@pytest.mark.parametrize(
    ("name", "bad"),
    [
        ("foreign bytes", b"\x80\x04\x95pickled?"),
        ("truncated", seal_json("response", {"deltas": [["a", [1]]]}, key=OURS)[:-3]),
        ("another version", b"MMGATE\x00\x09" + seal_json("response", 1, key=OURS)[8:]),
        ("another stage", seal_json("embedding", {"deltas": []}, key=OURS)),
        ("wrong length", seal("json", "response", b"[1,2,3]", key=OURS)[:-1] + b"]]"),
        ("another key", seal_json("response", "moved", key="mmgate:test:t:response:j")),
    ],
)
async def test_bad_bytes_under_our_key_are_a_counted_miss_then_replaced(
    redis: RedisProcess, name: str, bad: bytes
) -> None:
    tier = tier_for(redis.url)
    actor = actor_for(tier)
    actor.start()
    try:
        assert tier.redis_key("t", "response", "k") == OURS
        await tier.client.set(OURS, bad)
        made = computed("fresh")
        lookup = await actor.get("k", made, tenant="t", tier=STAGE)
        assert (lookup.value, lookup.tier) == ("fresh", None)
        assert made.calls == [1]
        assert sum(tier.bad_values.values()) == 1, tier.bad_values

        async def replaced() -> bool:  # the write-back of the good value has landed
            return bool(await tier.client.get(OURS) != bad)

        await eventually(replaced, timeout=10)
        # the good value replaced the bad one, with the stage's TTL (60 s here)
        assert 0 < await tier.client.pttl(tier.redis_key("t", "response", "k")) <= 60_000
        assert unseal_json(await tier.client.get(OURS), "response", key=OURS) == "fresh"
    finally:
        await actor.aclose()
        await tier.close()


@pytest.mark.parametrize(
    ("how", "tenant", "key"),
    [
        ("COPY", "t", "other-prompt"),
        ("COPY", "u", "k"),  # the same prompt, another tenant
        ("GET+SET", "t", "other-prompt"),
        ("GET+SET", "u", "other-prompt"),
    ],
)
async def test_a_value_copied_under_another_key_is_a_counted_miss_never_served(
    redis: RedisProcess, how: str, tenant: str, key: str
) -> None:
    tier = tier_for(redis.url)
    actor = actor_for(tier)
    actor.start()
    try:
        await tier.set("t", "k", {"answer": "for k"}, stage="response", timeout=1)
        source, target = (
            tier.redis_key("t", "response", "k"),
            tier.redis_key(tenant, "response", key),
        )
        if how == "COPY":
            assert redis.cli("COPY", source, target) == "1"
        else:
            await tier.client.set(target, await tier.client.get(source))
        made = computed({"answer": f"for {key}"})
        lookup = await actor.get(key, made, tenant=tenant, tier=STAGE)
        assert (lookup.value, lookup.tier) == ({"answer": f"for {key}"}, None)
        assert made.calls == [1]
        assert tier.bad_values == {"response: stored under another key": 1}
        # the value under its own key is still served
        assert await tier.get("t", "k", stage="response", timeout=1) == {"answer": "for k"}
    finally:
        await actor.aclose()
        await tier.close()


async def read_back(tier: RedisTier, key: str) -> Any:
    """What ``tier`` serves for tenant t's ``key``."""
    return await tier.get("t", key, stage="response", timeout=1)


async def test_with_a_secret_only_values_signed_with_it_are_read(redis: RedisProcess) -> None:
    signed, other, unsigned = (tier_for(redis.url, secret=s) for s in (b"ours", b"theirs", None))
    try:
        await signed.set("t", "a", "signed", stage="response", timeout=1)
        await unsigned.set("t", "b", "unsigned", stage="response", timeout=1)
        assert await read_back(signed, "a") == "signed"
        assert await read_back(other, "a") is None
        assert await read_back(unsigned, "a") is None  # no half-trust without the secret
        assert await read_back(signed, "b") is None
        assert dict(signed.bad_values) == {"response: not signed with this deployment's secret": 1}
        assert dict(other.bad_values) == {"response: not signed with this deployment's secret": 1}
        assert dict(unsigned.bad_values) == {
            "response: signed with a secret, and this deployment has none": 1
        }
    finally:
        for tier in (signed, other, unsigned):
            await tier.close()


async def test_the_start_check_tells_a_wrong_password_and_an_unreachable_redis(
    tmp_path: Path,
) -> None:
    server = redis_server(tmp_path, password="s3cret")
    closed = free_port()
    checked = {
        "right": f"redis://:s3cret@127.0.0.1:{server.port}/0",
        "wrong": f"redis://:not-the-password@127.0.0.1:{server.port}/0",
        "none": f"redis://127.0.0.1:{server.port}/0",
        "wrong user": f"redis://nobody:s3cret@127.0.0.1:{server.port}/0",
        "closed port": f"redis://:s3cret@127.0.0.1:{closed}/0",
    }
    answers = {}
    try:
        for name, url in checked.items():
            tier = tier_for(url)
            try:
                answers[name] = await tier.check()
            finally:
                await tier.close()
    finally:
        server.stop()
    assert answers == {
        "right": None,
        "wrong": "Redis refused the credentials",
        "none": "Redis refused the credentials",
        "wrong user": "Redis refused the credentials",
        "closed port": f"Redis is not reachable at 127.0.0.1:{closed}",
    }


def test_an_address_in_a_message_never_holds_the_password() -> None:
    assert redis_address("redis://:s3cret@10.0.0.5:6380/0") == "10.0.0.5:6380"
    assert redis_address("rediss://mmgate:s3cret@redis.example/1") == "redis.example:6379"
    assert redis_address("redis://[::1]:7000") == "[::1]:7000"


async def test_a_killed_redis_fails_no_lookup_opens_the_breaker_and_is_used_again(
    redis: RedisProcess,
) -> None:
    tier = tier_for(redis.url)
    actor = actor_for(tier)
    actor.start()
    try:
        await actor.get("before", computed(1), tenant="t", tier=STAGE)
        await written(tier, "before")
        redis.kill()
        killed = time.monotonic()
        for i in range(10):
            lookup = await actor.get(f"k{i}", computed(i), tenant="t", tier=STAGE)
            assert lookup.value == i  # computed: no caller sees the outage
        stats = actor.stats()
        assert stats.tier_breaker_open
        assert stats.tier_errors == 3  # the breaker opened after 3 failed reads
        opened = time.monotonic() - killed
        redis.start()  # the same port, empty (no persistence)

        async def used_again() -> bool:
            await actor.get(f"after-{time.monotonic()}", computed(0), tenant="t", tier=STAGE)
            return not actor.stats().tier_breaker_open and redis.cli("DBSIZE") != "0"

        await eventually(used_again, timeout=30)
    finally:
        await actor.aclose()
        await tier.close()
    assert opened < 5


async def test_a_stopped_redis_times_out_as_misses_within_the_tier_timeout(
    redis: RedisProcess,
) -> None:
    tier = tier_for(redis.url, timeout_seconds=0.2)
    actor = actor_for(tier, tier_timeout=0.2, tier_breaker_failures=100)
    actor.start()
    redis.pause()
    try:
        started = time.monotonic()
        for i in range(3):
            assert (await actor.get(f"k{i}", computed(i), tenant="t", tier=STAGE)).value == i
        took = time.monotonic() - started
        assert actor.stats().tier_errors == 3
    finally:
        redis.resume()
        await actor.aclose()
        await tier.close()
    assert took < 3 * 0.2 + 1.0  # each lookup waited one tier timeout, no more
    print(f"\nredis stopped -> 3 lookups computed in {took:.2f} s (tier timeout 0.2 s)")


async def test_password_acl_user_and_tls(tmp_path: Path) -> None:
    for directory in ("password", "acl", "tls"):
        (tmp_path / directory).mkdir()
    servers = [
        (redis_server(tmp_path / "password", password="s3cret"), None),
        (
            redis_server(tmp_path / "acl", acl="mmgate on >pw ~mmgate:* &mmgate:* +@all"),
            "redis://mmgate:pw@127.0.0.1:{port}/0",
        ),
        (tls_redis_server(tmp_path / "tls"), None),
    ]
    try:
        for server, url in servers:
            target = url.format(port=server.port) if url else server.url
            extra: dict[str, Any] = {}
            if server.tls is not None:
                extra["tls_ca_file"] = server.tls / "ca.crt"
            tier = tier_for(target, **extra)
            try:
                await tier.set("t", "k", {"ok": True}, stage="response", timeout=1)
                assert await tier.get("t", "k", stage="response", timeout=1) == {"ok": True}
            finally:
                await tier.close()
        # without the password, or as an ACL user outside its key pattern: refused
        bare = tier_for(f"redis://127.0.0.1:{servers[0][0].port}/0")
        with pytest.raises(Exception, match=r"(?i)auth"):
            await bare.get("t", "k", stage="response", timeout=1)
        await bare.close()
    finally:
        for server, _ in servers:
            server.stop()


async def test_a_cluster_shares_values_and_invalidations(tmp_path: Path) -> None:
    nodes = redis_cluster(tmp_path)
    tiers = [tier_for(f"redis://127.0.0.1:{nodes[i].port}/0", cluster=True) for i in (0, 2)]
    actors = [actor_for(tier) for tier in tiers]
    try:
        for actor, tier in zip(actors, tiers, strict=True):
            actor.start()
            tier.listen(forget_in(actor))
        first, second = actors
        for i in range(20):  # keys spread over the three masters' slots
            await first.get(f"k{i}", computed(i), tenant="t", tier=STAGE)
        await written(tiers[0], *(f"k{i}" for i in range(20)))
        served = [
            await second.get(f"k{i}", computed(-1), tenant="t", tier=STAGE) for i in range(20)
        ]
        assert [(s.value, s.tier) for s in served] == [(i, "redis") for i in range(20)]
        assert all(node.cli("DBSIZE") != "0" for node in nodes)
        await subscribed(nodes, tiers[1].channel, listeners=2)
        await first.invalidate("k3", tenant="t", stage=Stage.RESPONSE)

        async def dropped() -> bool:
            return (await second.inspect("k3", tenant="t")).state == "absent"

        await eventually(dropped, timeout=10)
    finally:
        for actor, tier in zip(actors, tiers, strict=True):
            await actor.aclose()
            await tier.close()
        for node in nodes:
            node.stop()


async def test_a_full_redis_refusing_writes_still_serves_what_it_holds(tmp_path: Path) -> None:
    server = redis_server(
        tmp_path, extra=["--maxmemory", "4mb", "--maxmemory-policy", "noeviction"]
    )
    tier = tier_for(server.url)
    actor = actor_for(tier, tier_breaker_failures=2)
    actor.start()
    try:
        await actor.get("held", computed("kept"), tenant="t", tier=STAGE)
        await written(tier, "held")
        # Redis over its maxmemory: from now on it refuses every write (OOM), reads go on
        server.cli("CONFIG", "SET", "maxmemory", "1")
        for i in range(5):
            await actor.get(f"new{i}", computed(i), tenant="t", tier=STAGE)

        async def refused() -> bool:
            return actor.stats().tier_write_errors >= 5

        await eventually(refused, timeout=10)
        # reads go on: the breaker stays closed and the held value is served from Redis
        other = actor_for(tier)
        other.start()
        try:
            lookup = await other.get("held", computed("recomputed"), tenant="t", tier=STAGE)
        finally:
            await other.aclose()
        assert (lookup.value, lookup.tier) == ("kept", "redis")
        stats = actor.stats()
        assert not stats.tier_breaker_open
        assert stats.tier_errors == 0
    finally:
        await actor.aclose()
        await tier.close()
        server.stop()


def test_the_start_names_what_the_redis_settings_leave_open(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("s3cret")
    open_settings = RedisSettings(url="redis://127.0.0.1:1/0")
    assert [w.split(":")[0] for w in redis_weaknesses(open_settings)] == [
        "no password in MMGATE_REDIS__URL",
        "no MMGATE_REDIS__VALUE_SECRET_FILE",
    ]
    closed = RedisSettings(url="redis://mmgate:pw@127.0.0.1:1/0", value_secret_file=secret)
    assert redis_weaknesses(closed) == []
