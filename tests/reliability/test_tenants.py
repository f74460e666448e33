"""What one tenant can do to another: each hostile request (or burst) that once blocked the event
loop or grew memory, sent by one tenant while another asks small questions one after another on
the same server. The server's own loop lag during the attack (its heartbeat's histogram), the
other tenant's slowest answer during the attack against its slowest before it, and the server's
memory before and after, go to docs/reliability.md's table of bounds."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import psutil
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.client import MmgateClient, build_request
from services.proto.mmgate.v1 import inference_pb2 as pb
from tests.services.prom import Scrape, scrape, scrape_until
from tests.support import RunningServer, slow_schema

from .conftest import record
from .corpus import DEEP_GROUPS, many_messages

MiB = 1024 * 1024
# the server's event loop lag while an attack runs, by its heartbeat (a beat every 0.5 s here):
# the attacks measured before their fixes held the loop 6.3-7.9 s, the log-probability burst
# still 0.25-0.5 s with vLLM's output processing on mmgate's loop; with it on a loop of its own
# and answers converted a few positions at a time, every beat waited 50 ms at most
BOUND_SECONDS = 0.25
LAG = "mmgate_event_loop_lag_seconds_bucket"
# tries of an attack whose lag passed the bound: the conversion that held the loop did so on
# every try, while a pause of the whole process (one of 5.3 s once, in every thread, the loop's
# in epoll) comes now and then
TRIES = 2
PROBES_BEFORE = 20

Attack = Callable[[MmgateClient], Awaitable[object]]


async def _refused(call: Awaitable[object]) -> object:
    with contextlib.suppress(grpc.aio.AioRpcError):
        return await call
    return None


def _raw(request: pb.GenerateRequest) -> Attack:
    async def attack(client: MmgateClient) -> object:
        return await _refused(client.inference.Complete(request, timeout=60))

    return attack


async def _logprob_burst(client: MmgateClient) -> object:
    request = build_request(
        "Tell a long story.",
        max_tokens=480,
        n=8,
        logprobs=20,
        temperature=1.0,
        ignore_eos=True,
        cache_policy="bypass",
    )
    calls = [client.complete_request(request, timeout=120) for _ in range(4)]
    return await asyncio.gather(*(_refused(call) for call in calls))


SLOTS = 32  # the engine's max_num_seqs on this server (the default)
LONG_RUN = 400  # tokens of each long run: within the server's context of 512
SAMPLES = 8  # a long run's: a few runs fill the engine, and reach it together
RUNNING = (SLOTS - 1) // SAMPLES  # the attacker's runs that run at once (a slot kept free)
# whole waves of runs, with the slot kept for newcomers (RUNNING at once) and without it (one
# more): the attacker holds every slot it may take until its last wave ends, seconds after its
# first, however late a busy host delivers their tokens
HOLDERS = RUNNING * (RUNNING + 1)
EPISODES = 3

ATTACKS: dict[str, Attack] = {
    "1,000,000 empty stop strings": _raw(
        pb.GenerateRequest(prompt="Hi", sampling=pb.SamplingParams(stop=[""] * 1_000_000))
    ),
    "a chat of 300,000 messages": _raw(many_messages(300_000)),
    "a JSON schema pattern of 30,000 nested groups": _raw(
        pb.GenerateRequest(
            prompt="Hi",
            sampling=pb.SamplingParams(
                json_schema=json.dumps({"type": "string", "pattern": DEEP_GROUPS})
            ),
        )
    ),
    "4 x Complete(n=8, 480 tokens, 20 log-probabilities)": _logprob_burst,
}


async def _slowest(
    ask: Callable[[], Awaitable[object]], until: asyncio.Future[Any] | None, count: int
) -> float:
    """The slowest of ``count`` answers, or of as many as the attack lasts."""
    slowest = 0.0
    asked = 0
    while (until is None and asked < count) or (until is not None and not until.done()):
        started = time.perf_counter()
        await ask()
        slowest = max(slowest, time.perf_counter() - started)
        asked += 1
    return slowest


async def test_one_tenant_holds_another_up_within_a_bound(llava_server: RunningServer) -> None:
    server = psutil.Process(llava_server.process.pid)
    rows: list[dict[str, Any]] = []
    async with (
        MmgateClient(llava_server.target, tenant="attacker", timeout=120) as attacker,
        MmgateClient(llava_server.target, tenant="victim", timeout=120) as victim,
    ):
        health = health_pb2_grpc.HealthStub(victim.channel)

        def loop_probe() -> Awaitable[object]:  # answered on the event loop, no engine
            return health.Check(health_pb2.HealthCheckRequest(), timeout=60)  # type: ignore[no-any-return]

        def question() -> Awaitable[pb.CompleteResponse]:  # the other's work: through the engine
            return victim.complete("Hi", max_tokens=1, cache_policy="bypass")

        for name, attack in ATTACKS.items():
            lags: list[float] = []  # each try's: a pause of the whole process is not the attack's
            while len(lags) < TRIES and (not lags or lags[-1] > BOUND_SECONDS):
                loop_before = await _slowest(loop_probe, None, PROBES_BEFORE)
                wait_before = await _slowest(question, None, PROBES_BEFORE)
                rss_before = server.memory_info().rss
                lags_before = await scrape(llava_server.metrics_url)
                running = asyncio.ensure_future(attack(attacker))
                loop_during, wait_during = await asyncio.gather(
                    _slowest(loop_probe, running, 0), _slowest(question, running, 0)
                )
                await running
                lags.append(await _longest_lag(llava_server, lags_before))
            loop, wait = (loop_before, loop_during), (wait_before, wait_during)
            rss = (rss_before, server.memory_info().rss)
            rows.append({**_row(name, lags[-1], loop, wait, rss), "server_lag_tries_s": lags})
        rows.append(await _long_runs(llava_server, loop_probe, question))
    record("tenants", {"bound_seconds": BOUND_SECONDS, "attacks": rows})
    # the event loop's bound, by the server's own heartbeat (a health check's round trip, as
    # the other tenant saw it, is recorded: this process, busy reading the attacker's answers,
    # holds it up too); the other tenant's wait for the engine is recorded, bounded by order (a
    # slot for newcomers: _long_runs), not by a time
    for row in rows:
        assert row["server_lag_s"] <= BOUND_SECONDS, rows


async def _longest_lag(server: RunningServer, before: Scrape) -> float:
    """The longest wait of a heartbeat on the server's loop since ``before`` (the next beat
    included): the upper bound of the highest bucket that gained a beat (inf: past the last)."""

    def beats(after: Scrape, le: str) -> float:
        return after.value(LAG, le=le) - before.value(LAG, le=le)

    after = await scrape_until(server.metrics_url, lambda s: beats(s, "+Inf") > 0)
    total = beats(after, "+Inf")
    bounds = sorted(float(dict(labels)["le"]) for name, labels in after.samples if name == LAG)
    return next(bound for bound in bounds if beats(after, _le(bound)) == total)


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else str(bound)


async def _long_runs(
    llava_server: RunningServer,
    loop_probe: Callable[[], Awaitable[object]],
    question: Callable[[], Awaitable[pb.CompleteResponse]],
) -> dict[str, Any]:
    """The attacker's long runs take every engine slot it may take, more wait behind them;
    the other tenant's question comes while they hold the slots (while one of those waiting
    still waits, by the server's own queue times) and is granted at once: the slot kept for
    newcomers. Without it, the question waited for the first run to end (the length of a run:
    minutes for 600-token streams on a busy engine).

    Where the attacker had no run left waiting once the question was answered (a host so
    busy that a whole wave ran meanwhile), the episode proves nothing either way and is run
    again, at most ``EPISODES`` times."""
    server = psutil.Process(llava_server.process.pid)
    loop_before = await _slowest(loop_probe, None, PROBES_BEFORE)
    wait_before = await _slowest(question, None, PROBES_BEFORE)
    rss_before = server.memory_info().rss
    lags_before = await scrape(llava_server.metrics_url)
    for _ in range(EPISODES):
        # the attacker's runs on a connection of their own: on the one that carried the
        # log-probability burst's answers (megabytes each), this process's own event loop stood
        # still for 6 s as the runs began, while the server and the engine went on working
        async with MmgateClient(llava_server.target, tenant="attacker", timeout=120) as runs:
            episode = await _episode(llava_server, runs, loop_probe, question)
        if episode is not None:
            break
        print("the attacker's last runs had their slots before the question's answer: once more")
    else:
        raise AssertionError(
            f"in {EPISODES} episodes every run of the attacker's had its slot before the answer"
        )
    answer, loop_during, wait_during = episode
    lag = await _longest_lag(llava_server, lags_before)
    assert answer.final.queue_ms < 1, (
        f"the other tenant waited {answer.final.queue_ms:.0f} ms for an attacker's run to end"
    )
    return _row(
        f"{HOLDERS} x Generate(n={SAMPLES}, {LONG_RUN} tokens): every slot it may take",
        lag,
        (loop_before, loop_during),
        (wait_before, wait_during),
        (rss_before, server.memory_info().rss),
    )


Span = tuple[float, float]  # before the attack, during it


def _row(attack: str, lag: float, loop: Span, wait: Span, rss: tuple[int, int]) -> dict[str, Any]:
    """One attack's line of docs/reliability.md's table (seconds, and MiB before and after)."""
    return {
        "attack": attack,
        "server_lag_s": lag,
        "loop_before_s": round(loop[0], 3),
        "loop_during_s": round(loop[1], 3),
        "wait_before_s": round(wait[0], 3),
        "wait_during_s": round(wait[1], 3),
        "rss_before_mib": round(rss[0] / MiB),
        "rss_after_mib": round(rss[1] / MiB),
    }


async def _episode(
    llava_server: RunningServer,
    attacker: MmgateClient,
    loop_probe: Callable[[], Awaitable[object]],
    question: Callable[[], Awaitable[pb.CompleteResponse]],
) -> tuple[pb.CompleteResponse, float, float] | None:
    """The long runs and the question among them: the answer, the slowest health check while
    it was asked and the wall time it took; None where the question may have come when the
    attacker held less than it may (by the server's own queue figures)."""

    async def long_run() -> None:
        request = build_request(
            "Tell a long story.",
            max_tokens=LONG_RUN,
            ignore_eos=True,
            cache_policy="bypass",
            n=SAMPLES,
            temperature=1.0,
            stream_interval=LONG_RUN,  # the first token, then the rest at once: a light client
        )
        async for _ in attacker.generate(request):
            pass

    def waiting(scraped: Scrape) -> float:
        return scraped.value("mmgate_queue_depth", tenant="attacker")

    calls = [asyncio.ensure_future(long_run()) for _ in range(HOLDERS)]
    try:
        # every run in mmgate's queue and the first wave holding its slots: at least one whole
        # wave waits behind the one that runs, with the newcomers' slot or without
        queued = HOLDERS - RUNNING - 1
        found = await scrape_until(llava_server.metrics_url, lambda s: waiting(s) >= queued)
        if waiting(found) < queued:
            await asyncio.gather(*calls)
            return None
        asked = time.monotonic()
        asking = asyncio.ensure_future(question())
        loop_during = await _slowest(loop_probe, asking, 0)
        answer = await asking
        wait_during = time.monotonic() - asked
        # a run of the attacker's still waiting once answered: it held every slot it may take
        # all the while the question was in the server
        held = waiting(await scrape(llava_server.metrics_url)) > 0
        await asyncio.gather(*calls)
    finally:
        for call in calls:
            call.cancel()
        await asyncio.gather(*calls, return_exceptions=True)
    return (answer, loop_during, wait_during) if held else None


SLOW_PROPERTIES = 120  # a schema's: 13-14 s to compile here
ABANDONED = 4  # schemas the first tenant leaves compiling
ABANDON_SECONDS = 2.0  # their deadline


async def test_what_a_tenant_leaves_compiling_holds_another_up_by_one_compile_at_most(
    llava_server: RunningServer,
) -> None:
    """vLLM compiles grammars one at a time and goes on with one whose caller left: a tenant
    that sends schemas and leaves at once must not queue up compiles ahead of another's yes/no
    choice. One of its schemas is in the engine at a time (mmgate's compile gate); the others
    wait in mmgate and go with their callers."""

    def constrained() -> pb.GenerateRequest:
        return build_request(
            "Describe it.",
            max_tokens=1,
            cache_policy="bypass",
            json_schema=slow_schema(SLOW_PROPERTIES),
        )

    async with (
        MmgateClient(llava_server.target, tenant="measurer", timeout=300) as measurer,
        MmgateClient(llava_server.target, tenant="abandoner", timeout=300) as abandoner,
        MmgateClient(llava_server.target, tenant="chooser", timeout=300) as chooser,
    ):
        # one compile of such a schema, to its first token, on this host now
        started = time.monotonic()
        await measurer.complete_request(constrained())
        one_compile = time.monotonic() - started
        assert one_compile > ABANDON_SECONDS, "the schema compiled before its caller would leave"

        left = await asyncio.gather(
            *(
                abandoner.complete_request(constrained(), timeout=ABANDON_SECONDS)
                for _ in range(ABANDONED)
            ),
            return_exceptions=True,
        )
        codes = {e.code() if isinstance(e, grpc.aio.AioRpcError) else e for e in left}
        assert codes == {grpc.StatusCode.DEADLINE_EXCEEDED}, left

        started = time.monotonic()
        answer = await chooser.complete_request(
            build_request("Yes or no?", max_tokens=4, cache_policy="bypass", choice=["yes", "no"])
        )
        waited = time.monotonic() - started
    print(f"one compile {one_compile:.1f} s; the choice, after {ABANDONED} left: {waited:.1f} s")
    assert answer.text in {"yes", "no"}
    # the rest of the one compile the abandoner has in the engine, then its own: without the
    # gate, all four of the abandoner's (about 4 x one_compile - 2 s)
    assert waited < 2 * one_compile, (
        f"the choice waited {waited:.1f} s behind abandoned schemas"
        f" (one compile: {one_compile:.1f} s)"
    )
