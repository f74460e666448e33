"""What health says in degraded mode, one look of the health monitor at a time: a real cache
actor behind the service's front, an engine stand-in that serves. The real server's degraded
mode under load is in tests/reliability/test_chaos.py.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from grpc_health.v1 import health_pb2
from grpc_health.v1._async import HealthServicer

from cache_actor import CacheActor
from services.api.health import CACHE_ACTOR, LIVENESS, READINESS, HealthMonitor
from services.config import HealthSettings
from services.pipeline.cache_front import MAX_REPLACEMENTS, CacheFront
from tests.support import until

pytestmark = pytest.mark.asyncio

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
INFERENCE = "mmgate.v1.Inference"


def serving_engine() -> Any:
    progress = SimpleNamespace(silence=lambda now: 0.0, in_flight=0)
    return SimpleNamespace(stopped=False, failed=False, ready=True, progress=progress)


async def monitor(on_failure: str) -> tuple[HealthMonitor, HealthServicer, CacheFront]:
    front = CacheFront(CacheActor, on_failure)  # type: ignore[arg-type]
    front.start()
    servicer = HealthServicer()
    settings = HealthSettings(interval_seconds=0.05)
    watching = HealthMonitor(settings, servicer, front, serving_engine(), (INFERENCE,))
    await watching.starting()
    return watching, servicer, front


def says(servicer: HealthServicer) -> dict[str, int]:
    services = ("", INFERENCE, READINESS, LIVENESS, CACHE_ACTOR)
    return {name: servicer._server_status[name] for name in services}


async def crash(front: CacheFront) -> None:
    front.actor.inject_fault("crash")
    await until(lambda: not front.actor.alive)


async def test_compute_survives_three_deaths_and_a_fourth_fails_liveness() -> None:
    watching, servicer, front = await monitor("compute")
    await watching.update()
    assert set(says(servicer).values()) == {SERVING}
    for _ in range(MAX_REPLACEMENTS):
        await crash(front)
        await watching.update()  # the monitor's ping finds it dead: replaced
        assert front.actor.alive
        assert set(says(servicer).values()) == {SERVING}
    await crash(front)
    await watching.update()
    found = says(servicer)
    assert found[LIVENESS] == NOT_SERVING
    assert found[READINESS] == NOT_SERVING
    assert found[CACHE_ACTOR] == NOT_SERVING


async def test_a_stalled_actor_is_not_serving_alone_while_inference_serves() -> None:
    watching, servicer, front = await monitor("compute")
    front.actor.inject_fault("stall", 0.5)
    await watching.update()  # the ping times out
    found = says(servicer)
    assert found[CACHE_ACTOR] == NOT_SERVING
    assert {found[s] for s in ("", INFERENCE, READINESS, LIVENESS)} == {SERVING}
    assert front.degraded == "cache_stalled"
    await front.ping(timeout=5.0)  # the stall is over
    await watching.update()
    assert set(says(servicer).values()) == {SERVING}
    await front.aclose()


async def test_fail_fails_liveness_at_the_first_death() -> None:
    watching, servicer, front = await monitor("fail")
    await crash(front)
    await watching.update()
    found = says(servicer)
    assert found[LIVENESS] == NOT_SERVING
    assert found[""] == NOT_SERVING
    assert found[CACHE_ACTOR] == NOT_SERVING
    assert front.replacements == 0
