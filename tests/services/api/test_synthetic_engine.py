"""The whole server over an engine handed in: real gRPC, auth, cache actor, queue, tracing and
metrics in front of the synthetic engine (services/engine/synthetic.py), no vLLM engine."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest
import pytest_asyncio
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from services.api.server import MmgateServer
from services.client import Credentials, MmgateClient
from services.config import Settings
from services.engine.synthetic_engine import SyntheticEngine
from services.observability.tracing import Tracing
from tests.services.auth.support import TOKEN_GRANTS, TOKENS, write_tokens

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def synthetic(
    tiny_model: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[tuple[MmgateServer, InMemorySpanExporter]]:
    tokens = tmp_path_factory.mktemp("synthetic") / "tokens.json"
    write_tokens(tokens, TOKEN_GRANTS)
    settings = Settings(
        host="127.0.0.1",
        port=0,
        auth={"mode": "token", "tokens_file": tokens},
        metrics={"port": 0},
        # the synthetic engine, as a server's settings name it: a step a millisecond
        engine={"queue": True, "synthetic": {"step_seconds": 0.001}},
        health={"loop_block_seconds": 3600},
    )
    exporter = InMemorySpanExporter()
    tracing = Tracing(settings, span_processors=[SimpleSpanProcessor(exporter)], environ={})
    server = MmgateServer(settings, model=tiny_model, tracing=tracing)
    await server.start()
    try:
        yield server, exporter
    finally:
        await server.stop(grace=1)


def client_of(server: MmgateServer, token: str | None) -> MmgateClient:
    return MmgateClient(
        f"127.0.0.1:{server.port}", credentials=Credentials(token=token), timeout=30, retries=False
    )


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
