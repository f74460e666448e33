"""The replicas' sharing against a real 3-master Redis Cluster (``MMGATE_REDIS__CLUSTER=true``):
an image encoded by one is a Redis hit on the other, a deterministic response is shared, and an
invalidation reaches the other replica."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from services.models import build_tiny_llava
from tests.redis_support import RedisProcess, redis_cluster
from tests.replicas import Replicas
from tests.support import RunningServer

from . import test_replicas as shared

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[RedisProcess]]:
    nodes = redis_cluster(tmp_path_factory.mktemp("cluster"))
    yield nodes
    for node in nodes:
        node.stop()


@pytest.fixture(scope="module")
def replicas(
    tmp_path_factory: pytest.TempPathFactory, cluster: list[RedisProcess]
) -> Iterator[tuple[RunningServer, RunningServer]]:
    # each replica knows one node; the client finds the others
    model = build_tiny_llava(tmp_path_factory.mktemp("models") / "tiny-llava")
    group = Replicas(
        tmp_path_factory.mktemp("cluster-replicas"),
        model,
        cluster[1].url,
        MMGATE_REDIS__CLUSTER="true",
        # these tests are of sharing, not of a slow Redis (test_replicas.py's): a cluster call
        # that a loaded 2-vCPU host delays past the default 0.25 s is a miss, and this test
        # failed once with a CPU-bound process beside the suite
        MMGATE_REDIS__TIMEOUT_SECONDS="5",
    )
    group.start_all(2)
    try:
        yield group.pair
    finally:
        group.stop()


async def test_sharing_through_a_cluster(
    replicas: tuple[RunningServer, RunningServer], cluster: list[RedisProcess]
) -> None:
    stored = shared.keys_in(*cluster)
    for seed in (11, 12, 13):  # keys in different slots
        await shared.image_is_shared(*replicas, seed=seed, stored=stored)
    await shared.response_is_shared(*replicas, "Name three mountains.", stored)
    await shared.invalidate_reaches_the_other(*replicas, seed=14)
    assert sum(int(node.cli("DBSIZE")) for node in cluster) > 0
