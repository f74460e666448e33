"""The whole server in the test process over the synthetic engine (no vLLM engine to start),
token auth, its spans kept in memory: for the tests of the front alone."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from services.api.server import MmgateServer
from services.client import Credentials, MmgateClient
from services.config import Settings
from services.observability.tracing import Tracing
from tests.services.auth.support import TOKEN_GRANTS, TOKENS, write_tokens


@contextlib.asynccontextmanager
async def synthetic_server(
    model: str,
    directory: Path,
    *,
    step_seconds: float,
    engine: dict[str, Any] | None = None,
    **settings: Any,
) -> AsyncIterator[tuple[MmgateServer, InMemorySpanExporter]]:
    """Started and, at the end, stopped; ``engine``: more of the engine's settings (its
    ``synthetic`` ones replace ``step_seconds``), ``settings``: more of Settings' fields."""
    tokens = directory / "tokens.json"
    write_tokens(tokens, TOKEN_GRANTS)
    configured = Settings(
        host="127.0.0.1",
        port=0,
        auth={"mode": "token", "tokens_file": tokens},
        metrics={"port": 0},
        # the synthetic engine, as a server's settings name it
        engine={"queue": True, "synthetic": {"step_seconds": step_seconds}, **(engine or {})},
        health={"loop_block_seconds": 3600},
        **settings,
    )
    exporter = InMemorySpanExporter()
    tracing = Tracing(configured, span_processors=[SimpleSpanProcessor(exporter)], environ={})
    server = MmgateServer(configured, model=model, tracing=tracing)
    await server.start()
    try:
        yield server, exporter
    finally:
        await server.stop(grace=1)


def client_of(server: MmgateServer, token: str | None = TOKENS["alpha"]) -> MmgateClient:
    return MmgateClient(
        f"127.0.0.1:{server.port}", credentials=Credentials(token=token), timeout=30, retries=False
    )
