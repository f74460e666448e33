"""What one streamed gRPC message costs in Python's grpc.aio, without an engine: thread switches.

    python -m bench.grpc_stream [--streams 16] [--messages 64] [--step-ms 30] [--repeats 3]

A server process streams ``--messages`` small messages on each of ``--streams`` calls, all of them
at once on every tick of a shared ``--step-ms`` clock (what an engine step does to mmgate's
streams); this process is the client. Per stream, for the server and the client: voluntary and
involuntary context switches of all their threads, and CPU ms. Each variant runs on a fresh pair
of processes:
  default          grpcio as installed
  classic-poller   GRPC_EXPERIMENTS=-event_engine_client,-event_engine_listener,
                   -event_engine_for_all_other_endpoints in both processes: the thread that waits
                   on the completion queue polls the sockets itself
Ratios against ``default`` measured in the same run. docs/benchmarks.md reads these against the
engine's own context switches (bench/service.py) to say what a streamed token costs there.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence

import grpc

from tests.support import free_port

from .service import context_switches, process_cpu_seconds

CLASSIC_POLLER = "-event_engine_client,-event_engine_listener,-event_engine_for_all_other_endpoints"
VARIANTS = {"default": "", "classic-poller": CLASSIC_POLLER}
METHOD = "/bench.Stream/Messages"


async def serve(port: int, messages: int, step: float) -> None:
    """Every stream sends its next message on each tick of one shared clock."""
    tick = asyncio.Condition()

    async def clock() -> None:
        while True:
            await asyncio.sleep(step)
            async with tick:
                tick.notify_all()

    async def stream(request: bytes, context: grpc.aio.ServicerContext) -> None:
        for _ in range(messages):
            async with tick:
                await tick.wait()
            await context.write(b"a token's worth of bytes")

    server = grpc.aio.server()
    handler = grpc.unary_stream_rpc_method_handler(stream)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("bench.Stream", {"Messages": handler}),)
    )
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    ticking = asyncio.create_task(clock())
    try:
        await server.wait_for_termination()
    finally:
        ticking.cancel()


async def measure(port: int, server_pid: int, streams: int, messages: int) -> dict[str, float]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        await asyncio.wait_for(channel.channel_ready(), 30)
        call = channel.unary_stream(METHOD)

        async def one() -> int:
            return len([message async for message in call(b"", timeout=120)])

        await asyncio.gather(*(one() for _ in range(4)))  # connected and warm
        pids = {"server": [server_pid], "client": [os.getpid()]}
        switches = {role: context_switches(p) for role, p in pids.items()}
        cpu = {"server": process_cpu_seconds(server_pid), "client": time.process_time()}
        counts = await asyncio.gather(*(one() for _ in range(streams)))
        assert counts == [messages] * streams, counts
        out: dict[str, float] = {}
        for role, p in pids.items():
            voluntary, involuntary = context_switches(p)
            out[f"{role} voluntary"] = (voluntary - switches[role][0]) / streams
            out[f"{role} involuntary"] = (involuntary - switches[role][1]) / streams
        out["server CPU ms"] = (process_cpu_seconds(server_pid) - cpu["server"]) * 1000 / streams
        out["client CPU ms"] = (time.process_time() - cpu["client"]) * 1000 / streams
        return out


def run_variant(name: str, args: argparse.Namespace) -> dict[str, float]:
    """One variant on a fresh server and client, each its own process."""
    env = {**os.environ, "GRPC_EXPERIMENTS": VARIANTS[name]}
    port = free_port()
    sizes = ["--messages", str(args.messages), "--streams", str(args.streams)]
    me = [sys.executable, "-m", "bench.grpc_stream", *sizes, "--step-ms", str(args.step_ms)]
    server = subprocess.Popen([*me, "--serve", str(port)], env=env)
    try:
        client = subprocess.run(
            [*me, "--measure", str(port), str(server.pid)],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=True,
        )
    finally:
        server.kill()
        server.wait(timeout=30)
    figures = dict(line.rsplit("=", 1) for line in client.stdout.splitlines() if "=" in line)
    return {key: float(value) for key, value in figures.items()}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--messages", type=int, default=64)
    parser.add_argument("--step-ms", type=float, default=30.0)
    parser.add_argument("--repeats", type=int, default=3, help="alternated runs of each variant")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--measure", type=int, nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve is not None:
        asyncio.run(serve(args.serve, args.messages, args.step_ms / 1000))
        return
    if args.measure is not None:
        port, pid = args.measure
        for key, value in asyncio.run(measure(port, pid, args.streams, args.messages)).items():
            print(f"{key}={value}")
        return
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in VARIANTS}
    for _ in range(args.repeats):
        for name in VARIANTS:
            runs[name].append(run_variant(name, args))
    print(
        f"{args.streams} streams x {args.messages} messages, one tick every {args.step_ms:g} ms;"
        f" per stream, median of {args.repeats} alternated runs (ratio to default)"
    )
    keys = list(runs["default"][0])
    print(f"{'variant':<16}" + "".join(f"{key:>22}" for key in keys))
    base = {key: statistics.median(r[key] for r in runs["default"]) for key in keys}
    for name, results in runs.items():
        cells = []
        for key in keys:
            value = statistics.median(r[key] for r in results)
            cells.append(f"{value:.1f} ({value / base[key]:.2f}x)" if base[key] else f"{value:.1f}")
        print(f"{name:<16}" + "".join(f"{cell:>22}" for cell in cells))


if __name__ == "__main__":
    main()
