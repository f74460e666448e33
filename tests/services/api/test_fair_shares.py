"""Fair shares and priorities where requests wait: mmgate's queue in front of the real engine.

One server on the tiny model whose engine runs 4 sequences at once (``max_num_seqs``), so that a
few streams fill it; each tenant may have 48 requests in progress. Tenants are labels (mode
none): "heavy" weighs 3, "mixed" runs at priority 10 by default and may ask 0 to 10, the others
weigh 1 at priority 0. vLLM schedules by priority (a priority is configured). The "holder"
tenant's runs hold their slots until their callers go (an engine fault that stalls before the
engine sees the run, after mmgate's queue granted it): slots held for as long as a test needs,
however fast the engine runs on this host. The order of grants is read from the server's queue
spans (exported to the session's OTLP receiver), not from scrapes during the run: on a loaded
2-vCPU host a busy server answered scrapes 20-50 s late, past the moments they had to catch.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import time
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
import pytest_asyncio

from services.client import MmgateClient, build_request
from services.proto.mmgate.v1 import inference_pb2
from tests.services.otlp_receiver import OtlpReceiver, ReceivedSpan
from tests.services.prom import Scrape, scrape, scrape_until
from tests.services.statuses import violated_fields
from tests.support import RunningServer, start_server

pytestmark = pytest.mark.asyncio(loop_scope="session")

SLOTS = 4  # the engine's max_num_seqs here
SHARE = 48  # each tenant's requests in progress
LONG = 64  # tokens of a long stream
SERVICE = "mmgate-fair-shares"  # its spans' service.name


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def fair_server(
    tiny_model: str, tmp_path_factory: pytest.TempPathFactory, receiver: OtlpReceiver
) -> AsyncIterator[RunningServer]:
    """Started and stopped in a thread: the session's loop serves the OTLP receiver meanwhile
    (a server that stops flushes its spans, and would wait out the export's timeout)."""
    running = await asyncio.to_thread(
        start_server,
        tmp_path_factory.mktemp("fair"),
        tiny_model,
        MMGATE_ENGINE__MAX_NUM_SEQS=str(SLOTS),
        MMGATE_MAX_CONCURRENT_REQUESTS="128",
        MMGATE_TENANTS__MAX_CONCURRENT_REQUESTS=str(SHARE),
        # the fair order alone: every slot to whoever waits (the newcomers' slot is
        # tests/reliability/test_tenants.py's)
        MMGATE_TENANTS__NEWCOMER_SLOTS="0",
        MMGATE_TENANTS__SCHEDULING=json.dumps(
            {"heavy": {"weight": 3}, "mixed": {"priority": 10, "max_priority": 10}}
        ),
        MMGATE_CHAOS__ENABLED="true",
        MMGATE_CHAOS__TENANTS=json.dumps({"holder": {"engine": {"stall": 1.0}}}),
        MMGATE_TRACING__ENDPOINT=f"127.0.0.1:{receiver.port}",
        MMGATE_TRACING__PROTOCOL="grpc",
        MMGATE_TRACING__SERVICE_NAME=SERVICE,
        # the tests count on every queue span: an export that a starved host slows past the
        # default 10 s would be dropped
        OTEL_EXPORTER_OTLP_TIMEOUT="120",
    )
    yield running
    assert await asyncio.to_thread(running.stop) == 0, running.log()


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


async def grants(receiver: OtlpReceiver, since: int, tenants: dict[str, int]) -> list[ReceivedSpan]:
    """The queue spans of ``tenants``' runs (how many each) among the spans received after the
    first ``since``, in the order the queue granted them: a span ends at its run's grant, on the
    server's clock, which no caller's or scrape's stall on a loaded host blurs."""

    def of(spans: list[ReceivedSpan]) -> list[ReceivedSpan]:
        return [
            s
            for s in spans[since:]
            if s.name == "queue"
            and s.service == SERVICE
            and s.attributes.get("mmgate.tenant") in tenants
        ]

    def complete(spans: list[ReceivedSpan]) -> bool:
        counted = Counter(s.attributes["mmgate.tenant"] for s in of(spans))
        return all(counted[tenant] >= count for tenant, count in tenants.items())

    # spans leave in batches, every few seconds
    try:
        return sorted(of(await receiver.until(complete, timeout=180)), key=lambda s: s.end_ns)
    except TimeoutError:
        counted = Counter(s.attributes["mmgate.tenant"] for s in of(receiver.spans))
        raise AssertionError(f"queue spans received: {dict(counted)}, wanted {tenants}") from None


async def test_another_tenants_first_token_comes_when_a_slot_frees_not_after_a_whole_share(
    fair_server: RunningServer, tenants: dict[str, MmgateClient], receiver: OtlpReceiver
) -> None:
    """The probe: A holds its whole share of long requests (4 in the engine, 44 in mmgate's
    queue); B's first request starts as soon as the first of A's runs ends. A's share queues
    while the holder has every slot (so that it is seen whole whatever the host's speed), then
    A's runs take the slots and B comes. Long runs (512 tokens, unary to spare the test's
    process). Judged by the server's queue spans: when B was granted among A's grants."""
    tokens = 8 * LONG

    async def long_request() -> inference_pb2.GenerateFinal:
        answer = await tenants["a"].complete("Tell me a story", max_tokens=tokens, ignore_eos=True)
        assert answer.final.usage.completion_tokens == tokens
        return answer.final

    since = len(receiver.spans)
    held = await hold(fair_server, tenants["holder"], SLOTS)
    calls = [asyncio.ensure_future(long_request()) for _ in range(SHARE)]
    await queued(fair_server, "a", SHARE)
    await let_go(held)
    b = await stream(tenants["b"], 4)
    a = await asyncio.gather(*calls)
    assert b.final is not None
    assert b.final.queue_ms > 0, "B was granted at once: A's queue had drained before it came"
    order = await grants(receiver, since, {"a": SHARE, "b": 1})
    b_grant = next(i for i, s in enumerate(order) if s.attributes["mmgate.tenant"] == "b")
    b_span = order[b_grant]
    a_grants = [s.end_ns for s in order if s.attributes["mmgate.tenant"] == "a"]
    # A's first runs took the slots together; the 5th grant came when the first of them ended
    first_run_ms = (a_grants[SLOTS] - a_grants[0]) / 1e6
    last = max(final.queue_ms for final in a)
    print(
        f"B waited {b.final.queue_ms:.0f} ms for a slot (first token {b.ttft * 1000:.0f} ms "
        f"after it was sent); the first of A's running requests ended {first_run_ms:.0f} ms "
        f"after A's runs started; A's last request waited {last:.0f} ms; {b_grant} of A's "
        f"{SHARE} runs were granted before B's"
    )
    # B's run started at the first slot that came free after it came (several can free in one
    # engine step), not after A's queue: without mmgate's queue B waited in the engine's behind
    # all 44 of A's
    a_waiting = [t for t in a_grants if t > b_span.start_ns]
    assert len(a_waiting) > SLOTS, "B came after A's queue had drained: no test of it"
    a_while_b_waited = [t for t in a_waiting if t < b_span.end_ns]
    assert len(a_while_b_waited) < SLOTS, (len(a_while_b_waited), len(a_waiting))
    assert b.final.queue_ms <= 1.5 * first_run_ms + 50
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
    fair_server: RunningServer, tenants: dict[str, MmgateClient], receiver: OtlpReceiver
) -> None:
    """Both tenants' whole shares of equal requests wait together (the holder has every slot
    until they have all arrived), then run to their ends. Counted from the server's queue
    spans, in the order the queue granted the runs: each tenant's grants until the first of
    the two had none left waiting (both waited throughout, since no request arrived after)."""
    since = len(receiver.spans)
    held = await hold(fair_server, tenants["holder"], SLOTS)
    calls = [
        asyncio.ensure_future(
            tenants[tenant].complete("Tell me a story", max_tokens=4 * LONG, ignore_eos=True)
        )
        for _ in range(SHARE)
        for tenant in ("heavy", "light")
    ]
    await queued(fair_server, "heavy", SHARE)
    await queued(fair_server, "light", SHARE)
    await let_go(held)
    answers = await asyncio.gather(*calls)
    assert all(a.final.usage.completion_tokens == 4 * LONG for a in answers)
    order = [
        s.attributes["mmgate.tenant"]
        for s in await grants(receiver, since, {"heavy": SHARE, "light": SHARE})
    ]
    # the grant that left one of them with nothing waiting
    emptied = min(len(order) - 1 - order[::-1].index(tenant) for tenant in ("heavy", "light"))
    both_waited = Counter(order[: emptied + 1])
    heavy, light = both_waited["heavy"], both_waited["light"]
    print(f"granted while both waited: heavy {heavy}, light {light} ({heavy / light:.2f})")
    assert 2.5 <= heavy / light <= 3.5, (heavy, light)
    # alone, a tenant takes every slot: a share is not a cap
    await let_go(await hold(fair_server, tenants["holder"], 2 * SLOTS))


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
