"""What tracing and metrics add to a request's latency, enabled against disabled, in one run.

    python -m bench.observability [--requests N]                    (make bench-observability)

Two mmgate servers in this process on the tiny LLaVA test model (embeddings mode), started one
after the other and then both serving: ``off`` with no OTLP endpoint and no metrics server, and
``on`` with traces exported over OTLP/gRPC (the SDK's batch processor and the real exporter) to a
receiver this benchmark runs in a process of its own (as a collector runs elsewhere: decoding what
it receives is not the server's cost), and Prometheus metrics served and scraped every 0.5 s
meanwhile.
Requests alternate between the two servers, one at a time, so both see the same machine state.
Every request carries the same image, which both servers hold as a cached encoder output after
the warm-up (the case of interest: a cached-image request, whose own work is small, so overhead
shows most), and its own question; greedy, 4 new tokens, ``Complete``.

--text: the same with text requests to the default model (SmolLM2-135M, 16 new tokens, a new
prompt each time): a real request, whose own work is larger.

Printed: p50 and p99 latency of each, the spans the receiver got, and on/off at p50 and p99.
Goal: under 5% added latency at p50 (on/off below 1.05).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from services.api.server import MmgateServer
from services.client import HeldImages, MmgateClient, build_request
from services.config import Settings
from services.models import build_tiny_llava, engine_settings, prepare_default_model

from .images import ENV, photo
from .service import percentile

MAX_TOKENS = 4
# the text case: a real request to the default model (SmolLM2-135M), new prompt each time
TEXT_TOKENS = 16


class Receiver(trace_service_pb2_grpc.TraceServiceServicer):
    """An OTLP trace receiver that counts what it is sent."""

    def __init__(self) -> None:
        self.spans = 0

    async def Export(
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: Any
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        for resource in request.resource_spans:
            for scope in resource.scope_spans:
                self.spans += len(scope.spans)
        return trace_service_pb2.ExportTraceServiceResponse()


def settings(
    model: Path,
    *,
    observed: bool,
    otlp_port: int,
    observe: str = "both",
    ratio: float = 1.0,
    text: bool = False,
) -> Settings:
    # the text case: the default model with mmgate's defaults, a smaller KV cache (two engines)
    engine: dict[str, Any] = (
        {"model": str(model), "kv_cache_memory_bytes": 256 * 2**20}
        if text
        else engine_settings(model)
    )
    if not observed:
        return Settings(port=0, engine=engine, metrics={"enabled": False})
    traces = observe in ("both", "traces")
    return Settings(
        port=0,
        engine=engine,
        metrics={"port": 0, "enabled": observe in ("both", "metrics")},
        tracing={
            "endpoint": f"127.0.0.1:{otlp_port}" if traces else None,
            "protocol": "grpc",
            "sample_ratio": ratio,
        },
    )


async def scrape_until(url: str, stop: asyncio.Event) -> int:
    scrapes = 0
    while not stop.is_set():
        await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=5).read())
        scrapes += 1
        try:
            await asyncio.wait_for(stop.wait(), 0.5)
        except TimeoutError:
            continue
    return scrapes


async def _no_scrapes(stop: asyncio.Event) -> int:
    await stop.wait()
    return 0


async def sink() -> None:
    """The receiver alone (``--sink``): prints its port, and its span count when stdin closes."""
    receiver = Receiver()
    collector = grpc.aio.server()
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(receiver, collector)
    port = collector.add_insecure_port("127.0.0.1:0")
    await collector.start()
    print(port, flush=True)
    await asyncio.to_thread(sys.stdin.read)
    await collector.stop(0)
    print(receiver.spans, flush=True)


async def measure(
    model: Path, requests: int, warmup: int, observe: str, ratio: float, text: bool = False
) -> None:
    collector = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bench.observability",
        "--sink",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert collector.stdout is not None
    assert collector.stdin is not None
    otlp_port = int(await asyncio.wait_for(collector.stdout.readline(), 60))
    received = 0

    servers: dict[str, MmgateServer] = {}
    clients: dict[str, MmgateClient] = {}
    try:
        for name in ("off", "on"):
            server = MmgateServer(
                settings(
                    model,
                    observed=name == "on",
                    otlp_port=otlp_port,
                    observe=observe,
                    ratio=ratio,
                    text=text,
                ),
                model=str(model),
            )
            await server.start()
            servers[name] = server
            clients[name] = MmgateClient(f"127.0.0.1:{server.port}", timeout=120)
            clients[name].held = HeldImages(capacity=0)  # every request carries the bytes
        image = photo(7, (640, 480))
        latencies: dict[str, list[float]] = {"off": [], "on": []}
        stop = asyncio.Event()
        scraper = asyncio.create_task(
            scrape_until(f"http://127.0.0.1:{servers['on'].metrics.port}/metrics", stop)
            if servers["on"].settings.metrics.enabled
            else _no_scrapes(stop)
        )
        for i in range(warmup + requests):
            for name in ("off", "on") if i % 2 == 0 else ("on", "off"):
                request = (
                    build_request(
                        f"Question {i}: tell me about topic {i}.",
                        max_tokens=TEXT_TOKENS,
                        temperature=0.0,
                        ignore_eos=True,
                    )
                    if text
                    else build_request(
                        f"Question {i}: what is in the picture?",
                        images=[image],
                        max_tokens=MAX_TOKENS,
                        temperature=0.0,
                        ignore_eos=True,
                    )
                )
                started = time.perf_counter()
                answer = await clients[name].complete_request(request)
                elapsed = time.perf_counter() - started
                assert answer.final.usage.completion_tokens == (TEXT_TOKENS if text else MAX_TOKENS)
                if i >= warmup:
                    assert text or answer.final.cache.images[0].outcome == "hit"
                    latencies[name].append(elapsed)
        stop.set()
        scrapes = await scraper
    finally:
        for client in clients.values():
            await client.close()
        for server in servers.values():
            await server.stop(grace=5)
        collector.stdin.close()
        received = int(await asyncio.wait_for(collector.stdout.readline(), 60) or 0)
        await collector.wait()

    off, on = latencies["off"], latencies["on"]
    print(
        f"\ntext requests (the default model, {TEXT_TOKENS} tokens), {requests} each, alternating"
        if text
        else f"\ncached-image requests (640x480 JPEG, {MAX_TOKENS} tokens), {requests} each,"
        " alternating"
    )
    print(f"{'':<34} {'p50 ms':>8} {'p99 ms':>8}")
    for name, values in (("off: no tracing, no metrics", off), ("on: OTLP traces + metrics", on)):
        p50, p99 = percentile(values, 0.5) * 1000, percentile(values, 0.99) * 1000
        print(f"{name:<34} {p50:8.2f} {p99:8.2f}")
    print(
        f"'on': {observe}, sample ratio {ratio}; spans received: {received};"
        f" /metrics scraped {scrapes} times"
    )
    ratio50 = percentile(on, 0.5) / percentile(off, 0.5)
    ratio99 = percentile(on, 0.99) / percentile(off, 0.99)
    print(f"on/off at p50: {ratio50:.3f}x (goal < 1.05x); at p99: {ratio99:.3f}x")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200, help="requests per server")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--model", type=Path, help="tiny LLaVA folder (built when absent)")
    parser.add_argument(
        "--observe", choices=["both", "traces", "metrics"], default="both", help="what 'on' has"
    )
    parser.add_argument(
        "--sample-ratio", type=float, default=1.0, help="share of traces recorded by 'on'"
    )
    parser.add_argument(
        "--text", action="store_true", help="text requests to the default model instead"
    )
    parser.add_argument("--sink", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.sink:
        asyncio.run(sink())
        return
    for name, value in ENV.items():
        os.environ.setdefault(name, value)
    with tempfile.TemporaryDirectory() as tmp:
        if args.text:
            model = args.model or prepare_default_model(Settings().model_cache)
        else:
            model = args.model or build_tiny_llava(Path(tmp) / "tiny-llava")
        asyncio.run(
            measure(model, args.requests, args.warmup, args.observe, args.sample_ratio, args.text)
        )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
