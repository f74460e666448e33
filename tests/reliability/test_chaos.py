"""Chaos: decodes, encodes and engine requests fail, stall and slow down on purpose (the server's
MMGATE_CHAOS__* settings, for one tenant), while the client cancels at random moments and sends
tiny deadlines, the server's Redis is killed and started again, and a hostile tenant sends,
round after round, every input that once hurt other tenants (attacks.py). Every request ends
with a result or its documented status, and afterwards nothing is poisoned, stranded or leaked,
no image fetch goes on for a
caller who has gone, the Redis tier is used again, and health is SERVING again.

    calm tenant: the reference answers ─▶ chaos tenant: the load, faults and a rude client
    ─▶ quiet again? (flights, waiters, engine requests, active requests, stage threads, tasks)
    ─▶ every image key stored or absent, and servable ─▶ shared answers whole ─▶ SERVING
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import Counter

import grpc
from grpc_health.v1 import health_pb2

from services.cli.bench.load import Limits, Outcome, run
from services.cli.bench.report import status
from services.cli.bench.workload import Mix, Planned, Workload
from services.client import MmgateClient, digest_of, error_reason
from services.pipeline.responses import FIRST_LISTENER_SECONDS
from services.proto.mmgate.v1 import cache_pb2
from tests.redis_support import RedisProcess
from tests.services.prom import Scrape, scrape
from tests.support import RunningServer, eventually

from .attacks import Attacks, attack_until, attacks
from .conftest import CHAOS_PLANS, CHAOS_REQUESTS, CHAOS_TENANT, ChaosImages, record

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
STATUS = health_pb2.HealthCheckResponse.ServingStatus
CACHE_ACTOR = "mmgate.cache-actor"
INFERENCE = "mmgate.v1.Inference"
HOSTILE_TENANT = "hostile"
CONCURRENCY = 32
TIMEOUT_SECONDS = 5.0  # each request's deadline: a stalled one ends here
MIX = Mix(
    max_tokens=8,
    image_ratio=0.5,
    image_repeat=0.5,
    working_set=12,
    burst_every=25,
    burst_size=6,
    cancel_ratio=0.15,
    cancel_within=0.5,
    short_deadline_ratio=0.1,
    short_deadline=0.05,
    seed=5,
)
# every status a request may end with here, and why
DOCUMENTED = {
    "OK",
    "UNAVAILABLE (INJECTED_FAULT)",  # an injected failure (decode, encode or engine)
    "DEADLINE_EXCEEDED",  # a tiny deadline, or a stall that outlived the request's deadline
    "CANCELLED",  # the client cancelled it
}


def ended(outcome: Outcome) -> str:
    """How a request ended: its code, with mmgate's reason for UNAVAILABLE (a deadline that
    expires as an injected failure is sent reads DEADLINE_EXCEEDED, with either reason)."""
    return status(outcome) if outcome.code == "UNAVAILABLE" else outcome.code


def quiet(m: Scrape) -> dict[str, float]:
    """What must be back to zero once every call has ended."""
    return {
        "flights": m.value("mmgate_actor_flights"),
        "waiters": m.value("mmgate_actor_waiters"),
        "engine_in_flight": m.value("mmgate_engine_in_flight_requests"),
        "active_requests": m.value("mmgate_inference_active_requests"),
        "stage_threads_busy": m.total("mmgate_stage_threads_busy"),
        "stage_threads_waiting": m.total("mmgate_stage_threads_waiting"),
    }


async def idle_tasks(server: RunningServer) -> float:
    """The loop's task count once it has settled (two equal readings in a row)."""
    last = -1.0
    while True:
        tasks = (await scrape(server.metrics_url)).value("mmgate_event_loop_tasks")
        if tasks == last:
            return tasks
        last = tasks


async def test_faults_and_a_rude_client_leave_nothing_behind(
    chaos_server: RunningServer, chaos_redis: RedisProcess, chaos_images: ChaosImages
) -> None:
    server = chaos_server
    requests = CHAOS_REQUESTS
    workload = Workload(MIX)
    plans = [workload.next() for _ in range(requests)]
    async with (
        server.client(timeout=60.0) as calm,
        server.client(tenant=CHAOS_TENANT, timeout=TIMEOUT_SECONDS, retries=False) as chaos,
        server.client(tenant=HOSTILE_TENANT, timeout=60.0, retries=False) as hostile,
    ):
        # the answers without faults: what every whole answer under chaos must equal
        polite = dataclasses.replace(MIX, cancel_ratio=0.0, short_deadline_ratio=0.0)
        reference, _, _ = await run(
            calm, Workload(polite), Limits(requests=requests, concurrency=8)
        )
        assert Counter(o.code for o in reference) == {"OK": requests}
        tokens = {o.index: o.tokens for o in reference}
        tasks_before = await idle_tasks(server)

        # Redis, the second tier, is killed a third of the way in and started again at two thirds
        redis_events: dict[str, int] = {}
        done = 0

        def on_done(outcome: Outcome) -> None:
            nonlocal done
            done += 1
            if done == requests // 3:
                chaos_redis.kill()
                redis_events["killed_after"] = done
            elif done == 2 * requests // 3:
                chaos_redis.start()
                redis_events["restarted_after"] = done

        # the health services as a prober sees them through the load (the cache actor is
        # stalled, then killed, early in it: conftest.py)
        seen: Counter[tuple[int, int, int]] = Counter()

        async def probe() -> None:
            while True:
                states = [await calm.health(s) for s in (CACHE_ACTOR, "", INFERENCE)]
                seen[states[0], states[1], states[2]] += 1
                await asyncio.sleep(0.05)

        prober = asyncio.ensure_future(probe())
        # the hostile tenant, beside the load: round after round until it ends (one at least)
        load_done, hostility = asyncio.Event(), Attacks()
        attacker = asyncio.ensure_future(
            attack_until(hostile, attacks(chaos_images), load_done, hostility)
        )
        outcomes, _, wall = await run(
            chaos,
            Workload(MIX),
            Limits(requests=requests, concurrency=CONCURRENCY, timeout=TIMEOUT_SECONDS),
            on_done,
        )
        load_done.set()
        await attacker
        prober.cancel()
        await asyncio.gather(prober, return_exceptions=True)
        assert hostility.odd == [], hostility.summary()
        assert set(redis_events) == {"killed_after", "restarted_after"}
        codes = Counter(ended(o) for o in outcomes)
        assert len(outcomes) == requests  # every request was answered
        odd = {f"{ended(o)}: {o.message}" for o in outcomes if ended(o) not in DOCUMENTED}
        assert set(codes) <= DOCUMENTED, (codes, odd)
        assert codes["OK"] > requests // 3, codes

        # a whole answer, never a truncated one (a failed shared run is not replayed as done)
        whole = {MIX.max_tokens}
        short = [
            o.index
            for o in outcomes
            if o.code == "OK" and o.tokens not in whole | {tokens[o.index]}
        ]
        assert short == []

        # quiet again: nothing in flight, waiting or running for callers who have gone
        settled = time.monotonic()

        async def is_quiet() -> bool:
            return set(quiet(await scrape(server.metrics_url)).values()) == {0.0}

        await eventually(is_quiet, timeout=3 * TIMEOUT_SECONDS)
        quiet_after = time.monotonic() - settled
        metrics = await scrape(server.metrics_url)

        # a response producer whose caller left during the lookup waits a bounded time for
        # its first listener: back to the count before the load once those bounds are past
        async def no_more_tasks() -> bool:
            return await idle_tasks(server) <= tasks_before

        await eventually(no_more_tasks, timeout=FIRST_LISTENER_SECONDS + TIMEOUT_SECONDS)
        tasks_after = await idle_tasks(server)

        # every endless image fetch stopped once its caller had gone (the host saw it hang up)
        async def fetches_stopped() -> bool:
            return chaos_images.hung_up == chaos_images.host.hits["/drip.png"]

        await eventually(fetches_stopped, timeout=TIMEOUT_SECONDS)

        # no poisoned key: every image's entries are stored or absent, and a stored one serves
        images = await image_states(chaos, plans)
        stages = [state for _, states in images.values() for state in states.values()]
        assert set(stages) <= {"stored", "absent"}, stages
        served = await serve_ready_images(chaos, images)
        resent = await resend_bursts(server, chaos, plans, tokens)

        async def serving() -> bool:
            services = ("", "liveness", "readiness", CACHE_ACTOR)
            return all([await calm.health(s) == SERVING for s in services])

        serving_after = await eventually(serving, timeout=30)
        # the server answers a calm request at once
        assert (await calm.complete("Say hi", max_tokens=2)).text is not None

        injected = {
            f"{point} {fault}": int(
                metrics.value("mmgate_chaos_faults_total", point=point, fault=fault)
            )
            for point in ("decode", "encode", "engine")
            for fault in ("fail", "stall", "slow")
        }
        for point in ("decode", "encode", "engine"):
            assert sum(v for k, v in injected.items() if k.startswith(point)) > 0, injected
        # degraded mode: the stalled and the dead actor's lookups were computed by their
        # requests, the dead one replaced once; meanwhile the cache actor's health service said
        # NOT_SERVING while "" and the inference service stayed SERVING
        degraded = {
            reason: metrics.total("mmgate_cache_bypassed_total", reason=reason)
            for reason in ("cache_stalled", "cache_dead")
        }
        for fault in ("stall", "kill"):
            assert metrics.value("mmgate_chaos_faults_total", point="actor", fault=fault) == 1
        assert all(degraded.values()), degraded
        assert metrics.value("mmgate_cache_actor_replacements_total") == 1
        assert seen[NOT_SERVING, SERVING, SERVING] > 0, seen
        assert metrics.value("mmgate_cache_degraded") == 0
        actor = (await chaos.stats()).actor

        # the tier is used again after the restart: what is computed now is written there
        attempts = iter(range(50_000, 60_000))

        async def tier_used() -> bool:
            extra = Workload(dataclasses.replace(polite, image_ratio=1.0, seed=next(attempts)))
            await run(calm, extra, Limits(requests=2))
            return chaos_redis.cli("DBSIZE") != "0"

        await eventually(tier_used, timeout=30)
    assert metrics.value("mmgate_chaos_enabled") == 1
    assert actor.tier_errors > 0  # the reads that met the dead Redis, each a miss
    assert actor.waiters == 0
    assert actor.flights == 0
    record(
        "chaos",
        {
            "requests": requests,
            "concurrency": CONCURRENCY,
            "timeout_seconds": TIMEOUT_SECONDS,
            "plan": CHAOS_PLANS[CHAOS_TENANT],
            "client": {
                "cancel_ratio": MIX.cancel_ratio,
                "cancel_within_seconds": MIX.cancel_within,
                "short_deadline_ratio": MIX.short_deadline_ratio,
                "short_deadline_seconds": MIX.short_deadline,
            },
            "kinds": dict(Counter(o.kind for o in outcomes)),
            "hostile": {
                "tenant": HOSTILE_TENANT,
                "rounds": hostility.rounds,
                "codes": hostility.summary(),
                "endless_fetches_stopped": chaos_images.hung_up,
            },
            "codes": dict(sorted(codes.items())),
            "injected": injected,
            "wall_seconds": round(wall, 1),
            "actor": {
                "load_failures": actor.load_failures,
                "compute_timeouts": actor.compute_timeouts,
                "stalled_flights": actor.stalled_flights,
                "cancelled_waiters": actor.cancelled_waiters,
                "caller_timeouts": actor.caller_timeouts,
            },
            "truncated_answers": len(short),
            "image_entries": dict(Counter(stages)),
            "ready_images_served": served,
            "bursts_resent": resent,
            "quiet_after_seconds": round(quiet_after, 2),
            "tasks": {"before": tasks_before, "after": tasks_after},
            "redis": {
                **redis_events,
                "read_errors": actor.tier_errors,
                "write_errors": actor.tier_write_errors,
            },
            "serving_after_seconds": round(serving_after, 2),
            "degraded": {
                "bypassed": degraded,
                "replacements": 1,
                # (mmgate.cache-actor, "", the inference service) -> times seen
                "health_seen": {
                    "/".join(map(STATUS.Name, states)): count for states, count in seen.items()
                },
            },
        },
    )


async def image_states(
    client: MmgateClient, plans: list[Planned]
) -> dict[str, tuple[bytes, dict[str, str]]]:
    """Every image the load sent, for the chaos tenant: digest -> (bytes, state by stage)."""
    images = {digest_of(i.data): i.data for p in plans for i in p.request.images if i.data}
    states = {}
    for digest, data in sorted(images.items()):
        answer = await client.cache.Inspect(
            cache_pb2.InspectRequest(digest=digest), metadata=client.metadata, timeout=10
        )
        states[digest] = (data, {entry.stage: entry.state for entry in answer.stages})
    return states


async def serve_ready_images(
    client: MmgateClient, images: dict[str, tuple[bytes, dict[str, str]]]
) -> int:
    """Each image whose encoder output is held is served from it: a hit, no fault drawn."""
    served = 0
    for digest, (data, states) in images.items():
        if states.get("embedding") != "stored":
            continue
        prefetched = await client.cache.Prefetch(
            cache_pb2.PrefetchRequest(data=data), metadata=client.metadata, timeout=10
        )
        assert (prefetched.digest, prefetched.outcome) == (digest, "hit")
        served += 1
    assert served > 0
    return served


async def resend_bursts(
    server: RunningServer, client: MmgateClient, plans: list[Planned], tokens: dict[int, int]
) -> dict[str, int]:
    """Each distinct shared request once more, one at a time: a stored answer is whole, and a
    failure is a fault injected now, never one stored from the run (a poisoned response)."""
    seen: dict[bytes, Planned] = {}
    for p in plans:
        if p.kind == "burst":
            seen.setdefault(p.request.SerializeToString(), p)
    outcomes: Counter[str] = Counter()
    for planned in seen.values():
        before = await engine_faults(server)
        try:
            answer = await client.complete_request(planned.request, timeout=3.0)
        except grpc.aio.AioRpcError as error:
            reason = error_reason(error)
            ended = f"{error.code().name} ({reason})" if reason else error.code().name
            outcomes[ended] += 1
            # an injected failure now, or a stall that met the deadline; nothing else
            injected_now = await engine_faults(server) - before
            expected = {"UNAVAILABLE (INJECTED_FAULT)": 1.0, "DEADLINE_EXCEEDED": 0.0}
            assert (ended, injected_now) in expected.items(), "a stored failure was served"
            continue
        outcomes["from cache" if answer.final.cache.response_from_cache else "generated"] += 1
        assert answer.final.usage.completion_tokens == tokens[planned.index]
    return dict(outcomes)


async def engine_faults(server: RunningServer) -> float:
    return (await scrape(server.metrics_url)).value(
        "mmgate_chaos_faults_total", point="engine", fault="fail"
    )
