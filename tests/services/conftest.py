"""Real servers for the service tests: `mmgate serve` in a child process, real vLLM, loopback gRPC.

One server on the tiny test model serves the whole session (engine start takes seconds), and the
shutdown test, last, stops it; one in this process on the tiny LLaVA (tests/services/in_process.py)
serves the pipeline, tracing and health tests; tests that need other settings or the real default
model start their own.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from services.api.server import MmgateServer
from services.client import MmgateClient
from services.config import Settings
from services.models import build_test_adapter, build_tiny_model, engine_settings
from services.observability.tracing import Tracing
from tests.support import RunningServer, start_server
from tests.tls_support import CertificateAuthority, Issued

from .in_process import TRACED_SERVICE, InProcess, SpanWatch, start_watched
from .otlp_receiver import OtlpReceiver
from .smollm2 import build_adapter_root, start_smollm2


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(build_tiny_model(tmp_path_factory.mktemp("models") / "tiny"))


@pytest.fixture(scope="session")
def adapter_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_adapter_root(
        tmp_path_factory.mktemp("adapters"), tmp_path_factory.mktemp("adapter-scratch")
    )


@pytest.fixture(scope="session")
def smollm2_server(
    adapter_root: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    """The embedded default model with LoRA adapters, under token auth (tests/services/
    smollm2.py): the default model's tests and the adapter tests."""
    running = start_smollm2(
        adapter_root, tmp_path_factory.mktemp("smollm2-secrets"), tmp_path_factory.mktemp("smollm2")
    )
    yield running
    assert running.stop() == 0, running.log()


@pytest.fixture(scope="session")
def server(tiny_model: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    running = start_server(
        tmp_path_factory.mktemp("logs"),
        tiny_model,
        MMGATE_MAX_CONCURRENT_REQUESTS="16",
        # the idle-connection test waits for it
        MMGATE_METRICS__READ_TIMEOUT_SECONDS="2",
        # the shutdown test, last, drains a long stream on it
        MMGATE_SHUTDOWN_GRACE_SECONDS="60",
    )
    yield running
    # the shutdown test has stopped it (exit code 0) unless it did not run
    assert running.stop() == 0, running.log()


@pytest.fixture
async def client(server: RunningServer) -> AsyncIterator[MmgateClient]:
    async with server.client(timeout=60.0) as client:
        yield client


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def receiver() -> AsyncIterator[OtlpReceiver]:
    running = OtlpReceiver()
    await running.start()
    try:
        yield running
    finally:
        await running.stop()


@pytest.fixture(scope="session")
def llava_adapters(tiny_llava: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The in-process server's adapter root: ``language`` (its language model's layers, served
    from the start as "lm") and ``vision`` (a vision-tower layer too: embeddings mode refuses
    it)."""
    root = tmp_path_factory.mktemp("llava-adapters")
    build_test_adapter(tiny_llava, root / "language", seed=1)
    build_test_adapter(tiny_llava, root / "vision", seed=2, vision=True)
    return root


@pytest.fixture(scope="session")
def image_hosts_cert(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Issued]:
    """The CA image URLs' test servers are checked against (MMGATE_MEDIA__URL_CA_FILE), and
    their certificate, for the names a test's resolver maps to their loopback addresses."""
    ca = CertificateAuthority(tmp_path_factory.mktemp("image-hosts"), "image hosts CA")
    names = ("images.test", "internal.test", "private.test")
    return ca.issued.cert, ca.issue("image-hosts", "images.test", dns=names, server=True)


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def llava_in_process(
    tiny_llava: Path,
    llava_adapters: Path,
    receiver: OtlpReceiver,
    image_hosts_cert: tuple[Path, Issued],
) -> AsyncIterator[InProcess]:
    """The tiny LLaVA in embeddings mode in this process, tracing into memory and to
    ``receiver``, with a LoRA adapter "lm" and an adapter root; its tests run in the session's
    event loop."""
    settings = Settings(
        port=0,
        engine={
            **engine_settings(tiny_llava),
            "adapters": {"lm": llava_adapters / "language"},
            "adapter_root": llava_adapters,
        },
        # embeddings mode by name: auto leaves a tower this fast to the engine; image URLs
        # from the test image hosts (tests/services/pipeline/test_image_urls.py)
        media={
            "mode": "embeddings",
            "url_allow": ["127.0.0.2/32"],
            "url_ca_file": image_hosts_cert[0],
        },
        metrics={"port": 0},
        tracing={
            "endpoint": f"127.0.0.1:{receiver.port}",
            "protocol": "grpc",
            "service_name": TRACED_SERVICE,
        },
        max_concurrent_requests=16,
        # one decode at a time: a burst of large images queues there (and only there)
        threads={"decode": 1},
        # the session's loop stands still while tests of other loops run: that is no block of
        # this server's loop for its health to report
        health={"loop_block_seconds": 3600},
    )
    exporter = InMemorySpanExporter()
    watch = SpanWatch(exporter)
    # environ={}: this machine's OTEL_* variables have no say in the test
    tracing = Tracing(settings, span_processors=[SimpleSpanProcessor(exporter), watch], environ={})
    running = MmgateServer(settings, model=str(tiny_llava), tracing=tracing)
    try:
        startup = await start_watched(running)
        yield InProcess(running, exporter, watch, receiver, startup)
    finally:
        await running.stop(grace=5)
