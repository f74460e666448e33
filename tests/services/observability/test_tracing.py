"""Traces end to end: the session's mmgate server in this process on the tiny LLaVA model
(tests/services/in_process.py), real gRPC over loopback, spans read from the SDK's in-memory
exporter and, once, from a real OTLP receiver the server exports to over gRPC.

Each request carries a client traceparent with a fresh trace id: its spans are the ones of that
trace, whatever other tests left behind.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import secrets
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
import pytest_asyncio
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind, StatusCode

from services.client import MmgateClient, build_request
from services.observability.logs import JsonFormatter, TraceContextFilter
from services.pipeline.media import decode
from services.pipeline.media import stages as media_stages
from services.proto.mmgate.v1 import inference_pb2 as pb
from services.wire import digest_of
from tests.support import eventually

from ..imagegen import png
from ..in_process import TRACED_SERVICE, InProcess, finished, vllm_worker

pytestmark = pytest.mark.asyncio(loop_scope="session")

SERVICE = TRACED_SERVICE
COMPLETE = "/mmgate.v1.Inference/Complete"
GENERATE = "/mmgate.v1.Inference/Generate"


@pytest.fixture
def traced(llava_in_process: InProcess) -> InProcess:
    """The session's in-process server (tests/services/in_process.py), tracing into memory."""
    return llava_in_process


@pytest_asyncio.fixture(loop_scope="session")
async def client(traced: InProcess) -> AsyncIterator[MmgateClient]:
    async with MmgateClient(f"127.0.0.1:{traced.server.port}", timeout=60.0) as client:
        yield client


# ── helpers ──────────────────────────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class ClientSpan:
    trace_id: str
    span_id: str
    sampled: bool = True

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        flags = "01" if self.sampled else "00"
        return (("traceparent", f"00-{self.trace_id}-{self.span_id}-{flags}"),)


def client_span(*, sampled: bool = True) -> ClientSpan:
    return ClientSpan(secrets.token_hex(16), secrets.token_hex(8), sampled)


@dataclass(frozen=True)
class Node:
    """A span as both the in-memory exporter and the OTLP receiver give it."""

    name: str
    span_id: str
    parent_id: str
    attributes: dict[str, Any]
    links: tuple[str, ...] = ()


def of_trace(spans: Iterable[ReadableSpan], trace_id: str) -> list[ReadableSpan]:
    return [s for s in spans if s.context is not None and f"{s.context.trace_id:032x}" == trace_id]


def node(span: ReadableSpan) -> Node:
    assert span.context is not None
    return Node(
        name=span.name,
        span_id=f"{span.context.span_id:016x}",
        parent_id=f"{span.parent.span_id:016x}" if span.parent is not None else "",
        attributes=dict(span.attributes or {}),
        links=tuple(f"{link.context.span_id:016x}" for link in span.links),
    )


def one(spans: Sequence[ReadableSpan], name: str) -> ReadableSpan:
    [found] = [s for s in spans if s.name == name]
    return found


def attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


async def spans_of(
    traced: InProcess, trace_id: str, *names: str, count: int = 1
) -> list[ReadableSpan]:
    """The trace's spans once ``count`` spans of each of ``names`` have ended."""

    def complete(spans: tuple[ReadableSpan, ...]) -> list[ReadableSpan] | None:
        mine = of_trace(spans, trace_id)
        have = [s.name for s in mine]
        return mine if all(have.count(n) >= count for n in names) else None

    found: list[ReadableSpan] = await traced.watch.until(complete)
    return found


def ask(*images: bytes, text: str | None = None, **sampling: Any) -> pb.GenerateRequest:
    # a prompt of its own: the prompt stage misses and renders
    text = text or f"What is in picture {secrets.token_hex(4)}?"
    options = {"max_tokens": 8, "temperature": 0.0, **sampling}
    return build_request(text, images=list(images), **options)


ENGINE_PHASES = ("engine.queue", "engine.prefill", "engine.decode")
IMAGE_TREE = (COMPLETE, "cache.lookup", "prompt.render", "media.decode", "media.encode")


def assert_image_tree(nodes: list[Node], client: ClientSpan, model: str) -> dict[str, Node]:
    """One image request's span tree; returns its spans by role."""
    [server] = [n for n in nodes if n.name == COMPLETE]
    assert server.parent_id == client.span_id  # the client's traceparent is honoured
    lookups = {n.attributes["mmgate.cache.stage"]: n for n in nodes if n.name == "cache.lookup"}
    assert set(lookups) == {"prompt", "image", "embedding"}
    [render] = [n for n in nodes if n.name == "prompt.render"]
    [decode] = [n for n in nodes if n.name == "media.decode"]
    [encode] = [n for n in nodes if n.name == "media.encode"]
    [engine] = [n for n in nodes if n.name == f"text_completion {model}"]
    phases = {n.name: n for n in nodes if n.name in ENGINE_PHASES}
    assert set(phases) == set(ENGINE_PHASES)
    parents = {
        "prompt lookup": (lookups["prompt"], server),
        "embedding lookup": (lookups["embedding"], server),
        # the image is looked up inside the embedding's computation
        "image lookup": (lookups["image"], lookups["embedding"]),
        "render": (render, lookups["prompt"]),
        "decode": (decode, lookups["image"]),
        "encode": (encode, lookups["embedding"]),
        "engine": (engine, server),
        **{name: (phase, engine) for name, phase in phases.items()},
    }
    for role, (child, parent) in parents.items():
        assert child.parent_id == parent.span_id, role
    for lookup in lookups.values():
        assert lookup.attributes["mmgate.cache.outcome"] == "miss"
        assert len(lookup.attributes["mmgate.cache.key"]) == 12
        assert lookup.attributes["mmgate.cache.bytes"] > 0
        assert lookup.attributes["mmgate.cache.wait_ms"] >= 0
        assert "mmgate.cache.tier" not in lookup.attributes  # computed, not found in a tier
    assert engine.attributes["gen_ai.request.model"] == model
    assert engine.attributes["gen_ai.operation.name"] == "text_completion"
    return {"server": server, "engine": engine, **{f"{k} lookup": v for k, v in lookups.items()}}


# ── in memory ────────────────────────────────────────────────────────────────────────────────


async def test_an_image_request_makes_one_span_tree(
    traced: InProcess, client: MmgateClient
) -> None:
    caller = client_span()
    request = ask(png(901), request_id="traced-901")
    response = await client.inference.Complete(request, metadata=caller.metadata, timeout=60)
    spans = await spans_of(traced, caller.trace_id, *IMAGE_TREE, *ENGINE_PHASES)
    model = response.final.model
    roles = assert_image_tree([node(s) for s in spans], caller, model)

    server = one(spans, COMPLETE)
    assert server.kind is SpanKind.SERVER
    assert server.status.status_code is StatusCode.UNSET
    assert attrs(server)["rpc.service"] == "mmgate.v1.Inference"
    assert attrs(server)["rpc.method"] == "Complete"

    # the cache report and the spans name the same keys
    reported = {lookup.stage: lookup.key for lookup in response.final.cache.lookups}
    assert roles["prompt lookup"].attributes["mmgate.cache.key"] == reported["prompt"][:12]

    engine = roles["engine"].attributes
    usage = response.final.usage
    assert engine["gen_ai.response.id"] == "traced-901"
    assert engine["gen_ai.usage.input_tokens"] == usage.prompt_tokens
    assert engine["gen_ai.usage.output_tokens"] == usage.completion_tokens == 8
    assert engine["gen_ai.usage.cache_read_input_tokens"] == usage.cached_prompt_tokens
    assert engine["gen_ai.response.finish_reasons"] == ("length",)
    assert engine["gen_ai.request.max_tokens"] == 8
    assert engine["gen_ai.request.temperature"] == 0.0
    assert engine["mmgate.engine.images"] == 1
    # vLLM's own timestamps place the phases, one after another
    by_name = {s.name: s for s in spans}
    queue, prefill, decode = (by_name[n] for n in ENGINE_PHASES)
    assert all(attrs(s)["mmgate.engine.clock"] == "vllm" for s in (queue, prefill, decode))
    assert queue.end_time == prefill.start_time
    assert prefill.end_time == decode.start_time
    assert (decode.end_time or 0) <= (one(spans, f"text_completion {model}").end_time or 0)


async def test_a_coalesced_lookup_links_to_the_leaders_span(
    traced: InProcess, client: MmgateClient
) -> None:
    data = png(902)
    callers = [client_span(), client_span()]
    await asyncio.gather(
        *(
            client.inference.Complete(ask(data), metadata=caller.metadata, timeout=60)
            for caller in callers
        )
    )
    lookups = []
    for caller in callers:
        spans = await spans_of(traced, caller.trace_id, COMPLETE)
        [embedding] = [
            s
            for s in spans
            if s.name == "cache.lookup"
            and s.attributes
            and s.attributes["mmgate.cache.stage"] == "embedding"
        ]
        lookups.append(node(embedding))
    by_outcome = {n.attributes["mmgate.cache.outcome"]: n for n in lookups}
    assert set(by_outcome) == {"miss", "coalesced"}
    leader, follower = by_outcome["miss"], by_outcome["coalesced"]
    assert follower.links == (leader.span_id,)
    assert leader.links == ()
    # the follower computed nothing: no encode under its lookup
    everything = [node(s) for s in finished(traced.exporter)]
    assert not [n for n in everything if n.parent_id == follower.span_id]


async def test_a_hit_is_a_lookup_span_with_its_tier(
    traced: InProcess, client: MmgateClient
) -> None:
    data = png(903)
    await client.complete_request(ask(data))
    caller = client_span()
    await client.inference.Complete(ask(data), metadata=caller.metadata, timeout=60)
    spans = await spans_of(traced, caller.trace_id, COMPLETE)
    [embedding] = [
        node(s)
        for s in spans
        if s.name == "cache.lookup"
        and s.attributes
        and s.attributes["mmgate.cache.stage"] == "embedding"
    ]
    assert embedding.attributes["mmgate.cache.outcome"] == "hit"
    assert embedding.attributes["mmgate.cache.tier"] == "memory"
    assert not [s for s in spans if s.name in ("media.decode", "media.encode")]


async def test_a_shared_response_runs_the_engine_under_its_lookup(
    traced: InProcess, client: MmgateClient
) -> None:
    caller = client_span()
    request = ask(text=f"Share {secrets.token_hex(4)}", cache_policy="response")
    await client.inference.Complete(request, metadata=caller.metadata, timeout=60)
    spans = await spans_of(traced, caller.trace_id, COMPLETE, "text_completion tiny-llava")
    [response] = [
        node(s)
        for s in spans
        if s.name == "cache.lookup" and attrs(s)["mmgate.cache.stage"] == "response"
    ]
    assert response.attributes["mmgate.cache.outcome"] == "miss"
    # the run belongs to the flight, not to this call: it is the lookup's child
    assert node(one(spans, "text_completion tiny-llava")).parent_id == response.span_id


async def test_health_checks_are_not_traced(traced: InProcess, client: MmgateClient) -> None:
    assert await client.health() == 1  # SERVING
    caller = client_span()
    # a traced call after it: its span ends before its answer, so the health span would have too
    await client.cache.GetStats(pb_stats_request(), metadata=caller.metadata, timeout=30)
    await spans_of(traced, caller.trace_id, "/mmgate.v1.Cache/GetStats")
    services = {(s.attributes or {}).get("rpc.service") for s in finished(traced.exporter)}
    assert "grpc.health.v1.Health" not in services


def pb_stats_request() -> Any:
    from services.proto.mmgate.v1 import cache_pb2

    return cache_pb2.GetStatsRequest()


async def test_a_clients_unsampled_trace_is_not_recorded(
    traced: InProcess, client: MmgateClient
) -> None:
    unsampled, sampled = client_span(sampled=False), client_span()
    await client.cache.GetStats(pb_stats_request(), metadata=unsampled.metadata, timeout=30)
    await client.cache.GetStats(pb_stats_request(), metadata=sampled.metadata, timeout=30)
    await spans_of(traced, sampled.trace_id, "/mmgate.v1.Cache/GetStats")
    assert of_trace(finished(traced.exporter), unsampled.trace_id) == []


async def test_invalid_argument_is_an_error_with_its_code(
    traced: InProcess, client: MmgateClient
) -> None:
    caller = client_span()
    request = ask(text="hello", top_p=7.0)  # impossible sampling
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await client.inference.Complete(request, metadata=caller.metadata, timeout=30)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    [server] = await spans_of(traced, caller.trace_id, COMPLETE)
    assert server.status.status_code is StatusCode.ERROR
    assert (server.status.description or "").startswith("INVALID_ARGUMENT: ")
    assert server.attributes is not None
    assert server.attributes["rpc.grpc.status_code"] == grpc.StatusCode.INVALID_ARGUMENT.value[0]


async def test_a_cancelled_stream_ends_cancelled(traced: InProcess, client: MmgateClient) -> None:
    caller = client_span()
    client.metadata = caller.metadata
    request = ask(text="Long story", max_tokens=400, ignore_eos=True)
    stream = client.generate(request)
    first = await anext(stream)  # the engine is generating now
    assert first.HasField("delta")
    await stream.aclose()  # cancels the call
    spans = await spans_of(traced, caller.trace_id, GENERATE, "text_completion tiny-llava")
    server = one(spans, GENERATE)
    assert server.status.status_code is StatusCode.ERROR
    assert server.status.description == "CANCELLED"
    assert attrs(server)["rpc.grpc.status_code"] == grpc.StatusCode.CANCELLED.value[0]
    engine = one(spans, "text_completion tiny-llava")
    assert attrs(engine)["mmgate.engine.aborted"] is True
    assert "gen_ai.response.finish_reasons" not in attrs(engine)
    assert engine.status.status_code is StatusCode.UNSET  # the client left; nothing failed


async def test_a_deadline_exceeded_stream_ends_deadline_exceeded(
    traced: InProcess, client: MmgateClient
) -> None:
    caller = client_span()
    client.metadata = caller.metadata
    # 490 tokens take the tiny model ~0.5 s on an idle 2-core machine: 0.25 s cannot hold them
    request = ask(text="Long story", max_tokens=490, ignore_eos=True)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        async for _ in client.generate(request, timeout=0.25):
            pass
    assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    [server] = [s for s in await spans_of(traced, caller.trace_id, GENERATE) if s.name == GENERATE]
    assert server.attributes is not None
    assert server.status.status_code is StatusCode.ERROR
    assert (server.status.description or "").startswith("DEADLINE_EXCEEDED")
    assert server.attributes["rpc.grpc.status_code"] == grpc.StatusCode.DEADLINE_EXCEEDED.value[0]


async def test_vllm_is_handed_the_engine_spans_context(
    traced: InProcess, client: MmgateClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = vllm_worker(traced.server)
    vllm = engine._engine
    assert vllm is not None
    handed: list[dict[str, str] | None] = []
    generate = vllm.generate

    def spy(*args: Any, trace_headers: Any = None, **kwargs: Any) -> Any:
        handed.append(dict(trace_headers) if trace_headers else None)
        # vLLM here exports no spans of its own: it would only warn and drop them
        return generate(*args, trace_headers=None, **kwargs)

    monkeypatch.setattr(vllm, "generate", spy)
    monkeypatch.setattr(engine, "vllm_traces", True)
    caller = client_span()
    await client.inference.Complete(ask(text="hi"), metadata=caller.metadata, timeout=60)
    monkeypatch.undo()
    spans = await spans_of(traced, caller.trace_id, "text_completion tiny-llava")
    engine_span = one(spans, "text_completion tiny-llava").context
    assert engine_span is not None
    assert handed == [{"traceparent": f"00-{caller.trace_id}-{engine_span.span_id:016x}-01"}]


async def test_a_log_record_carries_the_trace_and_span_ids(
    traced: InProcess, client: MmgateClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    lines = io.StringIO()
    handler = logging.StreamHandler(lines)
    handler.addFilter(TraceContextFilter())
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("mmgate.test_tracing")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)

    def logged_decode(data: bytes, *args: Any, **kwargs: Any) -> Any:
        # in the decode's worker thread, which runs in a copy of the computation's context
        logger.info("decoded %s", digest_of(data)[:19])
        return decode(data, *args, **kwargs)

    monkeypatch.setattr(media_stages, "decode", logged_decode)
    caller = client_span()
    try:
        await client.inference.Complete(ask(png(904)), metadata=caller.metadata, timeout=60)
    finally:
        monkeypatch.undo()
        logger.removeHandler(handler)
    spans = await spans_of(traced, caller.trace_id, COMPLETE)
    [image] = [
        node(s)
        for s in spans
        if s.name == "cache.lookup"
        and s.attributes
        and s.attributes["mmgate.cache.stage"] == "image"
    ]
    [decode_span] = [node(s) for s in spans if s.name == "media.decode"]
    [line] = lines.getvalue().splitlines()
    record = json.loads(line)
    assert record["message"].startswith("decoded sha256:")
    assert record["logger"] == "mmgate.test_tracing"
    # logged inside the image stage's computation, in its worker thread: the decode's span,
    # a child of that lookup's
    assert (record["trace_id"], record["span_id"]) == (caller.trace_id, decode_span.span_id)
    assert decode_span.parent_id == image.span_id


# ── over the wire ────────────────────────────────────────────────────────────────────────────


async def test_an_image_requests_spans_reach_an_otlp_receiver(
    traced: InProcess, client: MmgateClient
) -> None:
    caller = client_span()
    response = await client.inference.Complete(ask(png(905)), metadata=caller.metadata, timeout=60)
    await spans_of(traced, caller.trace_id, *IMAGE_TREE, *ENGINE_PHASES)
    assert await traced.server.tracing.force_flush()  # the batch processor sends them now
    wanted = len(of_trace(finished(traced.exporter), caller.trace_id))

    def arrived(spans: list[Any]) -> bool:
        return len([s for s in spans if s.trace_id == caller.trace_id]) >= wanted

    received = [s for s in await traced.receiver.until(arrived) if s.trace_id == caller.trace_id]
    assert {s.service for s in received} == {SERVICE}
    nodes = [Node(s.name, s.span_id, s.parent_id, s.attributes, s.links) for s in received]
    assert_image_tree(nodes, caller, response.final.model)
    [server] = [s for s in received if s.name == COMPLETE]
    assert server.status_code == 0  # unset: the call succeeded


async def test_a_degraded_servers_lookups_are_reported_and_traced_as_bypass(
    traced: InProcess, client: MmgateClient
) -> None:
    """Degraded mode: with the actor stalled (fault injection) and found so, each lookup is
    computed by the request itself, and its report and its spans say why."""
    data = png(904)
    await client.complete_request(ask(data))  # held: a hit, were the actor answering
    front = traced.server.cache
    front.inject_fault("stall", 3.0)
    front.found_stalled()  # what the health monitor's next unanswered ping does
    try:
        caller = client_span()
        response = await client.inference.Complete(ask(data), metadata=caller.metadata, timeout=60)
        spans = await spans_of(traced, caller.trace_id, COMPLETE, "media.encode")
    finally:

        async def answering() -> bool:
            return front.degraded is None

        await eventually(answering, timeout=30)
    reported = {
        (lookup.stage, lookup.outcome, lookup.reason) for lookup in response.final.cache.lookups
    }
    assert reported == {("prompt", "bypass", "cache_stalled")}  # images report apart
    assert [image.outcome for image in response.final.cache.images] == ["bypass"]
    lookups = {attrs(s)["mmgate.cache.stage"]: attrs(s) for s in spans if s.name == "cache.lookup"}
    for stage in ("prompt", "embedding"):
        assert lookups[stage]["mmgate.cache.outcome"] == "bypass"
        assert lookups[stage]["mmgate.cache.bypass_reason"] == "cache_stalled"
