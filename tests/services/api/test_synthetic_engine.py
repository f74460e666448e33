"""The whole server over an engine handed in: real gRPC, auth, cache actor, queue, tracing and
metrics in front of the synthetic engine (services/engine/synthetic.py), no vLLM engine."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import grpc
import pytest
import pytest_asyncio
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from services.api.server import MmgateServer
from services.engine.synthetic_engine import SyntheticEngine
from services.proto.mmgate.v1 import inference_pb2 as pb
from tests.services.api.synthetic_server import client_of, synthetic_server
from tests.services.auth.support import TOKENS

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def synthetic(
    tiny_model: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[tuple[MmgateServer, InMemorySpanExporter]]:
    async with synthetic_server(
        tiny_model, tmp_path_factory.mktemp("synthetic"), step_seconds=0.001
    ) as started:
        yield started


async def test_a_request_runs_through_every_part_to_the_engine_handed_in(
    synthetic: tuple[MmgateServer, InMemorySpanExporter],
) -> None:
    server, exporter = synthetic
    engine = server.engine
    assert isinstance(engine, SyntheticEngine)
    async with client_of(server, TOKENS["alpha"]) as client:
        first = await client.complete("hello there", max_tokens=8)
        again = await client.complete("hello there", max_tokens=8)
    assert first.text == again.text
    assert first.text.strip()
    assert first.final.usage.completion_tokens == len(first.token_ids) == 8
    # the engine was asked twice, through the queue; the prompt was cached by the actor
    assert engine.stats().requests == 2
    lookups = [[(r.stage, r.outcome) for r in m.final.cache.lookups] for m in (first, again)]
    assert lookups == [[("prompt", "miss")], [("prompt", "hit")]]
    # tracing saw each lookup
    looked = [span for span in exporter.get_finished_spans() if span.name == "cache.lookup"]
    assert len(looked) >= 2


async def test_the_auth_gate_stands_in_front_of_the_engine_handed_in(
    synthetic: tuple[MmgateServer, InMemorySpanExporter],
) -> None:
    server, _ = synthetic
    engine = server.engine
    assert isinstance(engine, SyntheticEngine)
    asked = engine.stats().requests
    async with client_of(server, "not-a-token") as client:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await client.complete("hello", max_tokens=2)
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert engine.stats().requests == asked


async def test_the_scrape_reads_the_engine_handed_in(
    synthetic: tuple[MmgateServer, InMemorySpanExporter],
) -> None:
    server, _ = synthetic
    ready = {
        family.name: family.samples[0].value
        for family in server.metrics.registry.collect()
        if family.name in ("mmgate_engine_ready", "mmgate_actor_entries")
    }
    assert ready["mmgate_engine_ready"] == 1.0
    assert ready["mmgate_actor_entries"] >= 1


async def test_reading_tool_calls_is_traced_by_choice_and_count_never_by_content(
    synthetic: tuple[MmgateServer, InMemorySpanExporter],
) -> None:
    server, exporter = synthetic
    secret = "schema-text-7f3a"
    tool = pb.Tool(
        name="lookup",
        description=secret,
        parameters=json.dumps({"type": "object", "properties": {secret: {"type": "string"}}}),
    )
    exporter.clear()
    async with client_of(server, TOKENS["alpha"]) as client:
        # the synthetic engine writes its fixed text and enforces no constraint: "auto" finds
        # no call in it, "required" finds text where the calls' JSON should be
        auto = await client.complete("look it up", tools=[tool], max_tokens=8)
        forced = await client.complete(
            "look it up", tools=[tool], tool_choice="required", max_tokens=8
        )
    assert auto.choices[0].end.tool_calls == []
    assert auto.choices[0].end.tool_parse_error == ""
    assert auto.choices[0].text == auto.text
    assert forced.choices[0].end.tool_calls == []
    assert "not a list of calls" in forced.choices[0].end.tool_parse_error
    assert forced.final.finish_reason == pb.FINISH_REASON_LENGTH
    read = [span for span in exporter.get_finished_spans() if span.name == "tools.read"]
    assert [dict(span.attributes or {}) for span in read] == [
        {"mmgate.tools.choice": "auto", "mmgate.tools.calls": 0, "mmgate.tools.unread": 0},
        {"mmgate.tools.choice": "required", "mmgate.tools.calls": 0, "mmgate.tools.unread": 1},
    ]
    for span in exporter.get_finished_spans():
        assert secret not in json.dumps(dict(span.attributes or {}))
