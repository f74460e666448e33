"""Fair shares and priorities where requests wait: mmgate's queue in front of the real engine.

One server on the tiny model whose engine runs 4 sequences at once (``max_num_seqs``), so that a
few streams fill it; each tenant may have 24 requests in progress. Tenants are labels (mode
none): "heavy" weighs 3, "mixed" runs at priority 10 by default and may ask 0 to 10, the others
weigh 1 at priority 0. vLLM schedules by priority (a priority is configured). The "holder"
tenant's runs hold their slots until their callers go (an engine fault that stalls before the
engine sees the run, after mmgate's queue granted it): slots held for as long as a test needs,
however fast the engine runs on this host.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
import pytest_asyncio

from services.client import MmgateClient, build_request
from services.proto.mmgate.v1 import inference_pb2
from tests.services.prom import Scrape, scrape, scrape_until
from tests.services.statuses import violated_fields
from tests.support import RunningServer, start_server

pytestmark = pytest.mark.asyncio(loop_scope="session")

SLOTS = 4  # the engine's max_num_seqs here
SHARE = 48  # each tenant's requests in progress
LONG = 64  # tokens of a long stream


@pytest.fixture(scope="module")
def fair_server(
    tiny_model: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    running = start_server(
        tmp_path_factory.mktemp("fair"),
        tiny_model,
        MMGATE_ENGINE__MAX_NUM_SEQS=str(SLOTS),
        MMGATE_MAX_CONCURRENT_REQUESTS="128",
        MMGATE_TENANTS__MAX_CONCURRENT_REQUESTS=str(SHARE),
        MMGATE_TENANTS__SCHEDULING=json.dumps(
            {"heavy": {"weight": 3}, "mixed": {"priority": 10, "max_priority": 10}}
        ),
        MMGATE_CHAOS__ENABLED="true",
        MMGATE_CHAOS__TENANTS=json.dumps({"holder": {"engine": {"stall": 1.0}}}),
    )
    yield running
    assert running.stop() == 0, running.log()


@pytest_asyncio.fixture(loop_scope="session")
async def tenants(fair_server: RunningServer) -> AsyncIterator[dict[str, MmgateClient]]:
    names = ("a", "b", "heavy", "light", "mixed", "holder")
    async with contextlib.AsyncExitStack() as stack:
        clients = {
            name: await stack.enter_async_context(fair_server.client(tenant=name, timeout=120))
            for name in names
        }
        yield clients


def idle(found: Scrape) -> bool:
    """Nothing waits in mmgate's queue and no engine slot is held."""
    held = ("mmgate_queue_engine_slots_in_use", "mmgate_queue_depth", "mmgate_queue_slots_held")
    return not any(found.total(name) for name in held)


@pytest_asyncio.fixture(loop_scope="session", autouse=True)
async def leaves_the_queue_empty(fair_server: RunningServer) -> AsyncIterator[None]:
    """Every test ends with its requests gone from the queue: no slot held, nobody waiting
    (a slot not handed back would shrink the engine for every later request)."""
    yield
    found = await scrape_until(fair_server.metrics_url, idle)
    assert idle(found), found.text


@dataclass
class Stream:
    """One streamed request as the caller saw it (time.monotonic())."""

    sent: float = field(default_factory=time.monotonic)
    first: float | None = None
    ended: float | None = None
    final: inference_pb2.GenerateFinal | None = None

    @property
    def ttft(self) -> float:
        assert self.first is not None
        return self.first - self.sent


async def stream(client: MmgateClient, tokens: int, **options: Any) -> Stream:
    seen = Stream()
    request = build_request("Tell me a story", max_tokens=tokens, ignore_eos=True, **options)
    async for event in client.generate(request):
        if event.HasField("delta") and seen.first is None:
            seen.first = time.monotonic()
        if event.HasField("final"):
            seen.final = event.final
    seen.ended = time.monotonic()
    return seen


async def metrics(server: RunningServer) -> Scrape:
    return await scrape(server.metrics_url)


async def queued(server: RunningServer, tenant: str, depth: int) -> Scrape:
    found = await scrape_until(
        server.metrics_url, lambda s: s.value("mmgate_queue_depth", tenant=tenant) == depth
    )
    assert found.value("mmgate_queue_depth", tenant=tenant) == depth, found.text
    return found


async def test_another_tenants_first_token_comes_when_a_slot_frees_not_after_a_whole_share(
    fair_server: RunningServer, tenants: dict[str, MmgateClient]
) -> None:
    """The probe: A holds its whole share of long requests (4 in the engine, 44 in mmgate's
    queue); B's first request starts as soon as the first of A's runs ends. Long (512 tokens,
    unary to spare the test's process): A's queue must outlast the scrape that sees it on a
    loaded host."""
    tokens = 8 * LONG

    async def long_request() -> inference_pb2.GenerateFinal:
        answer = await tenants["a"].complete("Tell me a story", max_tokens=tokens, ignore_eos=True)
        assert answer.final.usage.completion_tokens == tokens
        return answer.final

    held = [asyncio.ensure_future(long_request()) for _ in range(SHARE)]
    found = await scrape_until(
        fair_server.metrics_url,
        lambda s: s.value("mmgate_queue_depth", tenant="a") >= SHARE - 2 * SLOTS,
    )
    assert found.value("mmgate_queue_depth", tenant="a") >= SHARE - 2 * SLOTS, found.text
    b = await stream(tenants["b"], 4)
    a = await asyncio.gather(*held)
    assert b.final is not None
    # the server's own figures (the clients' clocks stall for seconds on a loaded 2-core host):
    # A's 5th request waited until the first of A's running requests ended
    waits = sorted(final.queue_ms for final in a)
    first_end, last = waits[SLOTS], waits[-1]
    print(
        f"B waited {b.final.queue_ms:.0f} ms for a slot (first token {b.ttft * 1000:.0f} ms "
        f"after it was sent); the first of A's running requests ended after {first_end:.0f} ms; "
        f"A's last request waited {last:.0f} ms"
    )
    # B's run started when a slot first came free after it came, not after A's queue: without
    # mmgate's queue B waited in the engine's behind all 44 of A's
    assert b.final.queue_ms <= 1.5 * first_end + 50
    assert last > 3 * b.final.queue_ms


async def hold(
    server: RunningServer, client: MmgateClient, count: int
) -> list[asyncio.Task[Stream]]:
    """``count`` of the holder's streams, once they hold every slot they can (the rest wait):
    each holds its slot until cancelled."""
    held = [asyncio.ensure_future(stream(client, 4)) for _ in range(count)]
    found = await scrape_until(
        server.metrics_url,
        lambda s: (
            s.value("mmgate_queue_slots_held", tenant="holder") == min(count, SLOTS)
            and s.value("mmgate_queue_depth", tenant="holder") == max(0, count - SLOTS)
        ),
    )
    assert found.value("mmgate_queue_slots_held", tenant="holder") == min(count, SLOTS), found.text
    return held


async def let_go(held: Sequence[asyncio.Future[Any]]) -> None:
    for call in held:
        call.cancel()
    await asyncio.gather(*held, return_exceptions=True)


async def test_weights_3_and_1_complete_3_to_1_and_one_tenant_alone_gets_every_slot(
    fair_server: RunningServer, tenants: dict[str, MmgateClient]
) -> None:
    """Both tenants' whole shares of equal requests wait together (the holder has every slot
    until they have all arrived), then run. Counted by the server, whose figures no caller's
    stall blurs: the runs each was granted from the start until a point where both still wait
    (no request arrives in between, so both waited throughout). Long runs (960 tokens), and a
    count of 28 grants of the 64 before heavy's queue is empty, leave a scrape some 9 rounds of
    runs to land in that window on a loaded host. A scrape that still lands after it (this
    2-vCPU host once starved the test's process through ~50 grants) saw nothing of the ratio:
    that observation is inconclusive, and the whole scenario runs again, three times at most;
    a conclusive one must hold."""
    observed = None
    for _ in range(3):
        observed = await weights_observed(fair_server, tenants)
        if observed is not None:
            break
        await scrape_until(fair_server.metrics_url, idle)  # the cancelled calls have left
    assert observed is not None, "no scrape landed while both tenants waited, three times"
    heavy, light = observed
    print(f"granted while both waited: heavy {heavy:.0f}, light {light:.0f} ({heavy / light:.2f})")
    assert 2.5 <= heavy / light <= 3.5, (heavy, light)
    # alone, a tenant takes every slot: a share is not a cap
    await scrape_until(fair_server.metrics_url, idle)  # the cancelled calls have left
    await let_go(await hold(fair_server, tenants["holder"], 2 * SLOTS))


async def weights_observed(
    fair_server: RunningServer, tenants: dict[str, MmgateClient]
) -> tuple[float, float] | None:
    """Heavy's and light's grants from the start to a scrape where both still wait; None when
    the scrape came after one of them had nothing left waiting."""
    held = await hold(fair_server, tenants["holder"], SLOTS)
    calls = [
        asyncio.ensure_future(
            tenants[tenant].complete("Tell me a story", max_tokens=15 * LONG, ignore_eos=True)
        )
        for _ in range(SHARE)
        for tenant in ("heavy", "light")
    ]
    await queued(fair_server, "heavy", SHARE)
    start = await queued(fair_server, "light", SHARE)
    await let_go(held)

    def granted(found: Scrape, tenant: str) -> float:
        name = "mmgate_queue_wait_seconds_count"
        return found.value(name, tenant=tenant) - start.value(name, tenant=tenant)

    def enough(found: Scrape) -> bool:
        return granted(found, "heavy") + granted(found, "light") >= 28

    end = await scrape_until(fair_server.metrics_url, enough, timeout=180)
    await let_go(calls)
    assert enough(end), end.text
    if any(end.value("mmgate_queue_depth", tenant=t) == 0 for t in ("heavy", "light")):
        heavy, light = granted(end, "heavy"), granted(end, "light")
        print(f"inconclusive: a late scrape, after {heavy:.0f} and {light:.0f} grants")
        return None
    return granted(end, "heavy"), granted(end, "light")


async def test_urgent_requests_wait_far_less_than_a_saturating_low_priority_load(
    fair_server: RunningServer, tenants: dict[str, MmgateClient]
) -> None:
    """40 low-priority requests (priority 10, the tenant's default) wait for the 4 slots, then
    6 urgent ones of the same tenant (priority 0, within its share) come; then the slots come
    free (the holder's callers go). The urgent ones go first. Compared: the server's figures of
    the wait for a slot (GenerateFinal.queue_ms), most of a time to first token here; the
    urgent callers' TTFTs, which their stalls blur, are printed too."""
    low_count = SHARE - 8
    held = await hold(fair_server, tenants["holder"], SLOTS)
    # lengths apart, so that the runs end at different steps
    low = [
        asyncio.ensure_future(
            tenants["mixed"].complete("Tell me a story", max_tokens=64 + 4 * i, ignore_eos=True)
        )
        for i in range(low_count)
    ]
    await queued(fair_server, "mixed", low_count)
    urgent = [asyncio.ensure_future(stream(tenants["mixed"], 4, priority=0)) for _ in range(6)]
    await queued(fair_server, "mixed", low_count + len(urgent))
    await let_go(held)
    answers = await asyncio.gather(*low)  # no low-priority request failed
    urgent_seen = await asyncio.gather(*urgent)
    assert {a.final.priority for a in answers} == {10}
    assert all(s.final is not None and s.final.priority == 0 for s in urgent_seen)
    low_wait = statistics.median(a.final.queue_ms for a in answers)
    urgent_wait = statistics.median(s.final.queue_ms for s in urgent_seen if s.final is not None)
    urgent_ttft = statistics.median(s.ttft for s in urgent_seen)
    print(
        f"wait for a slot p50: urgent {urgent_wait:.0f} ms, low priority {low_wait:.0f} ms "
        f"({low_wait / urgent_wait:.1f}x; both came while the slots were held); "
        f"urgent TTFT p50 {urgent_ttft * 1000:.0f} ms"
    )
    assert urgent_wait * 3 < low_wait


async def test_a_priority_outside_the_tenants_range_is_refused_naming_the_field(
    tenants: dict[str, MmgateClient],
) -> None:
    for tenant, priority in (("mixed", 11), ("mixed", -1), ("a", 1)):
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await tenants[tenant].complete("Hi", max_tokens=1, priority=priority)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert violated_fields(caught.value) == {"priority"}
        assert "outside this caller's range" in (caught.value.details() or "")
    info = await tenants["mixed"].model_info()
    assert (info.scheduling.priority, info.scheduling.min_priority) == (10, 0)
    assert info.scheduling.max_priority == 10
    assert (await tenants["heavy"].model_info()).scheduling.weight == 3


async def test_a_waiting_request_keeps_its_deadline_and_leaves_when_its_caller_goes(
    fair_server: RunningServer, tenants: dict[str, MmgateClient]
) -> None:
    before = await metrics(fair_server)
    # every slot held, and two more of the holder's runs waiting behind them
    held = await hold(fair_server, tenants["holder"], SLOTS + 2)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await tenants["b"].complete("Hi", max_tokens=4, timeout=0.5)
    assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    gone = asyncio.ensure_future(stream(tenants["b"], 4))
    await queued(fair_server, "b", 1)
    gone.cancel()
    await queued(fair_server, "b", 0)
    # one that waits its turn: it runs when the holder's callers go
    call = asyncio.ensure_future(tenants["b"].complete("Hi", max_tokens=4))
    await queued(fair_server, "b", 1)
    await let_go(held)
    answer = await call
    after = await metrics(fair_server)

    def change(name: str) -> float:
        return after.value(name, tenant="b") - before.value(name, tenant="b")

    assert change("mmgate_queue_left_total") == 2
    # neither of the two that left was handed to the engine: one run of b's was
    assert change("mmgate_queue_wait_seconds_count") == 1
    assert answer.final.usage.completion_tokens == 4
    assert answer.final.queue_ms > 0
