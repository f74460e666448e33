"""What a router's poll costs: Inference.GetLoad against the metrics scrape, on a busy replica.

    python -m bench.load_report [--streams 0,64,256] [--seconds 20] [--interval-ms 100]
                                [--json F]                              (make bench-load-report)

One ``mmgate serve`` over the synthetic engine (bench/frontend.py's ``mmgate-untraced``: a
token every ``--step-ms`` to each running request, no CPU for the engine; with ``--edges N``,
N edge processes in front of its core) on CPU 0, and for each
S in ``--streams`` a load generator in a process of its own on CPU 1 keeping S closed-loop
streams (bench/frontend_load.py; S=0: no load). Meanwhile this process polls as a router would,
every ``--interval-ms``, in turn:
  GetLoad        Inference.GetLoad over one gRPC channel kept open (docs/service.md's figures)
  GetServerInfo  the floor: a unary call on the same channel that reads nothing of the load
  scrape         GET /metrics on the replica's metrics port, over one HTTP connection kept
                 open: every family, ``mmgate_load_*`` among them (what an endpoint picker reads)
  floor          grpc.health.v1.Health/Check of an idle gRPC process of its own on the
                 replica's CPU (bench/frontend_bare.py, no streams): what any answer costs on
                 this host under this load, from a server whose loop has nothing else to do
Printed per S: each poll's latency p50/p99/max as this process saw it (its request sent to its
answer parsed), the answers' bytes, the scrape's p99 over GetLoad's; and the server's own time
for GetLoad, from its ``mmgate_grpc_request_duration_seconds`` (the share of calls answered
within 1 ms, its lowest bucket). The goal: GetLoad within a millisecond p99 under load, cheap
enough to poll every 100 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc
import httpx
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.client.credentials import channel_options
from services.config import Settings
from services.models import prepare_default_model
from services.proto.mmgate.v1 import inference_pb2 as pb
from services.proto.mmgate.v1 import inference_pb2_grpc
from tests.services.prom import parse
from tests.support import free_port

from . import frontend
from .openai_server import stop
from .synthetic_vllm import add_timing_options

NAME = "mmgate-untraced"
POLLS = ("GetLoad", "GetServerInfo", "scrape", "floor")
METHOD = "/mmgate.v1.Inference/GetLoad"


async def served_within_1ms(metrics_url: str) -> tuple[float, float]:
    """GetLoad calls the server has answered so far, and those within 1 ms (its histogram)."""
    async with httpx.AsyncClient() as http:
        text = (await http.get(metrics_url, timeout=10)).text
    scraped = parse(text)
    name = "mmgate_grpc_request_duration_seconds"
    return (
        scraped.value(f"{name}_count", method=METHOD),
        scraped.value(f"{name}_bucket", method=METHOD, le="0.001"),
    )


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summary(latencies_ms: list[float], sizes: list[int]) -> dict[str, Any]:
    return {
        "polls": len(latencies_ms),
        "p50_ms": statistics.median(latencies_ms),
        "p99_ms": percentile(latencies_ms, 0.99),
        "max_ms": max(latencies_ms),
        "bytes": statistics.median(sizes),
    }


async def poll(
    target: str, metrics_url: str, floor: str, seconds: float, interval: float
) -> dict[str, Any]:
    """Each of POLLS in turn, one every ``interval``, for ``seconds``."""
    got: dict[str, tuple[list[float], list[int]]] = {name: ([], []) for name in POLLS}
    async with (
        grpc.aio.insecure_channel(target, options=channel_options(retries=False)) as channel,
        grpc.aio.insecure_channel(floor, options=channel_options(retries=False)) as idle,
        httpx.AsyncClient() as http,
    ):
        stub = inference_pb2_grpc.InferenceStub(channel)
        health = health_pb2_grpc.HealthStub(idle)
        await stub.GetLoad(pb.GetLoadRequest(), timeout=10)  # the connections made
        await health.Check(health_pb2.HealthCheckRequest(), timeout=10)
        await http.get(metrics_url, timeout=10)
        ends = time.perf_counter() + seconds
        turn = 0
        while (now := time.perf_counter()) < ends:
            which = POLLS[turn % len(POLLS)]
            if which == "GetLoad":
                size = (await stub.GetLoad(pb.GetLoadRequest(), timeout=10)).ByteSize()
            elif which == "GetServerInfo":
                info = await stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=10)
                size = info.ByteSize()
            elif which == "floor":
                answer = await health.Check(health_pb2.HealthCheckRequest(), timeout=10)
                size = answer.ByteSize()
            else:
                reply = await http.get(metrics_url, timeout=10)
                reply.raise_for_status()
                size = len(reply.content)
            took = time.perf_counter() - now
            got[which][0].append(took * 1000)
            got[which][1].append(size)
            turn += 1
            await asyncio.sleep(max(interval - took, 0))  # a router's poll period
    return {name: summary(latencies, sizes) for name, (latencies, sizes) in got.items()}


async def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    model = str(prepare_default_model(Settings().model_cache))
    metrics_port = free_port()
    env = {"MMGATE_METRICS__PORT": str(metrics_port)}
    if args.edges:
        env["MMGATE_EDGES"] = str(args.edges)
    server = await frontend.start(NAME, 1, model, args, extra_env=env)
    metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
    try:
        idle = await frontend.start("bare", 1, model, args)
    except BaseException:
        await stop(server.process, 30)
        raise
    results = []
    try:
        for streams in args.streams:
            load = None
            if streams:
                load = asyncio.ensure_future(frontend.load(server, streams, model, args))
                await asyncio.sleep(args.warmup)  # the streams under way before the polls
            calls_before, within_before = await served_within_1ms(metrics_url)
            polled = await poll(
                server.target,
                metrics_url,
                idle.target,
                args.seconds - args.warmup,
                args.interval_ms / 1000,
            )
            calls, within = await served_within_1ms(metrics_url)
            share = (within - within_before) / (calls - calls_before)
            polled["GetLoad"]["server_within_1ms"] = share
            relayed = await load if load is not None else {}
            result = {"streams": streams, **polled, "tokens": relayed.get("tokens", 0)}
            results.append(result)
            ratio = polled["scrape"]["p99_ms"] / polled["GetLoad"]["p99_ms"]
            for name in POLLS:
                f = polled[name]
                print(
                    f"S={streams:<5} {name:8} {f['polls']:4d} polls  p50 {f['p50_ms']:7.3f} ms"
                    f"  p99 {f['p99_ms']:7.3f} ms  max {f['max_ms']:7.3f} ms"
                    f"  {f['bytes']:8.0f} B"
                )
            floor = polled["GetLoad"]["p99_ms"] / polled["floor"]["p99_ms"]
            print(
                f"S={streams:<5} scrape p99 / GetLoad p99 {ratio:.1f}x; GetLoad p99 / the"
                f" floor's {floor:.1f}x; the server answered {share:.1%} of GetLoad calls"
                " within 1 ms",
                flush=True,
            )
    finally:
        for each in (server, idle):
            await stop(each.process, 30)
            each.log.close()
    return results


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--streams", type=lambda t: [int(p) for p in t.split(",")], default=[0, 64, 256]
    )
    parser.add_argument("--seconds", type=float, default=20.0, help="a level's, the warm-up in it")
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--interval-ms", type=float, default=100.0)
    add_timing_options(parser)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument(
        "--edges", type=int, default=0, help="edge processes in front of the core (MMGATE_EDGES)"
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    results = asyncio.run(run(args))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"about": vars(args) | {"json": None}, "results": results}))


if __name__ == "__main__":
    main()
