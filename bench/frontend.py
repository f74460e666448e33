"""Front-end capacity at GPU rates: what one server process relays over an engine that costs no CPU.

    python -m bench.frontend [--streams 64,256,1024] [--sizes 1,4] [--seconds 10]
                             [--step-ms 15] [--contenders ...] [--json F] [--plot F]
                                                                        (make bench-frontend)

Every contender serves the same synthetic engine (services/engine/synthetic.py): each running
request gets a token every ``--step-ms``, up to 1,024 at once, its text the served model's
(SmolLM2-135M's tokenizer), so the engine makes S / step tokens a second for S streams:
  mmgate            mmgate serve over it (MMGATE_ENGINE__SYNTHETIC), tracing on: every trace
                    exported over OTLP to a receiver in a process of its own (ratio 1.0)
  mmgate-edges      the same, traced, with ``--edges`` edge processes in front of its core
                    (MMGATE_EDGES): its CPU is the core's and the edges' together, the core's
                    apart in the row's notes (what one core process carries)
  mmgate-edges-ids  the same, sent token ids as vLLM's gRPC servicer is (the chat template
                    applied by the load generator), not chat turns it renders and tokenizes
  mmgate-untraced   the same as mmgate with no tracing
  bare              the limit: a grpc.aio servicer of mmgate's Generate that streams the engine's
                    outputs with nothing else (bench/frontend_bare.py), on asyncio as mmgate
  vllm-grpc         vLLM's gRPC servicer (smg-grpc-servicer, as bench/vllm_grpc.py runs it)
  vllm-openai       vLLM's OpenAI server, chat completions streamed as server-sent events
the last two with the synthetic engine in the place of AsyncLLM.generate (bench/synthetic_vllm.py).
``--sizes``: tokens a message (the engine's stream interval; one, then four).

For each message size the servers start together; for each S the contenders take turns (their
order rotating; the others stopped with SIGSTOP meanwhile), each under S closed-loop streams from
a load generator in a process of its own (bench/frontend_load.py), ``--warmup`` s, then
``--seconds`` s counted. Servers run on CPU 0 and the load generator and trace receiver on CPU 1,
where there are two: the server's CPU is its own.
``client-bound``: the load generator was the limit (it used its whole core, or the server had CPU
to spare while the engine's rate went unmet).

Printed per contender, S and size: delivered tokens/s against what the engine offered,
messages/s, tokens a message, the gap between messages (ITL) p50/p99 in engine steps, TTFT
p50/p99, the server's CPU seconds per 1,000 tokens and its CPU share, and the load generator's;
then mmgate's ratio to each alternative, delivered tokens/s and CPU per 1,000 tokens.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import grpc
import httpx
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.config import EngineSettings, Settings
from services.engine.plan import EnginePlan
from services.engine.worker import EngineWorker
from services.models import prepare_default_model
from tests.support import free_port

from .openai_server import server_flags, stop
from .service import session_pids
from .synthetic_vllm import add_timing_options, timing_of

ROOT = Path(__file__).resolve().parent.parent
MAX_NUM_SEQS = 1024
START_TIMEOUT = 300.0
CONTENDERS = (
    "mmgate",
    "mmgate-edges",
    "mmgate-edges-ids",
    "mmgate-untraced",
    "bare",
    "vllm-grpc",
    "vllm-openai",
)
MMGATES = ("mmgate", "mmgate-edges", "mmgate-edges-ids")  # compared with every other
EDGED = ("mmgate-edges", "mmgate-edges-ids")
PROTOCOL = {
    "mmgate": "mmgate",
    "mmgate-edges": "mmgate",
    "mmgate-edges-ids": "mmgate-ids",
    "mmgate-untraced": "mmgate",
    "bare": "mmgate",
    "vllm-grpc": "vllm-grpc",
    "vllm-openai": "openai",
}
VLLM_MODULE = {
    "vllm-grpc": "vllm.entrypoints.launchers.grpc_server",
    "vllm-openai": "vllm.entrypoints.openai.api_server",
}


def cpus() -> tuple[list[str], list[str]]:
    """``taskset`` prefixes for the servers and for the load: CPU 0 and CPU 1, where two."""
    if len(os.sched_getaffinity(0)) < 2:
        return [], []
    return ["taskset", "-c", "0"], ["taskset", "-c", "1"]


@dataclass(slots=True)
class Server:
    name: str
    port: int
    process: asyncio.subprocess.Process
    log: IO[bytes]

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(Path(self.log.name).read_text(errors="replace").splitlines()[-lines:])


def timing_flags(args: argparse.Namespace) -> list[str]:
    return [
        "--step-ms",
        str(args.step_ms),
        "--prefill-us-per-token",
        str(args.prefill_us_per_token),
        "--answer-tokens",
        str(args.answer_tokens),
    ]


def command(
    name: str, port: int, size: int, model: str, args: argparse.Namespace
) -> tuple[list[str], dict[str, str]]:
    """The contender's command line and the environment it adds."""
    python = [sys.executable, "-m"]
    if name in VLLM_MODULE:
        engine = EngineSettings(
            max_num_seqs=MAX_NUM_SEQS,
            stream_interval=size,
            kv_cache_memory_bytes=256 * 2**20,
        )
        flags = server_flags(EngineWorker(engine).engine_args(EnginePlan(model, None)))
        line = [*python, "bench.synthetic_vllm", *timing_flags(args), VLLM_MODULE[name], *flags]
        return [*line, "--host", "127.0.0.1", "--port", str(port)], {}
    if name == "bare":
        line = [*python, "bench.frontend_bare", "--port", str(port), "--model", model]
        line += [*timing_flags(args), "--max-num-seqs", str(MAX_NUM_SEQS)]
        return [*line, "--stream-interval", str(size)], {}
    timing = timing_of(args)
    env = {
        "MMGATE_HOST": "127.0.0.1",
        "MMGATE_PORT": str(port),
        "MMGATE_ENGINE__MODEL": model,
        "MMGATE_ENGINE__SYNTHETIC": timing.model_dump_json(),
        "MMGATE_ENGINE__MAX_NUM_SEQS": str(MAX_NUM_SEQS),
        "MMGATE_ENGINE__STREAM_INTERVAL": str(size),
        "MMGATE_MAX_CONCURRENT_REQUESTS": str(4 * MAX_NUM_SEQS),
        "MMGATE_METRICS__PORT": "0",
    }
    if name in MMGATES:
        env.update(
            MMGATE_TRACING__ENDPOINT=f"127.0.0.1:{args.otlp_port}",
            MMGATE_TRACING__PROTOCOL="grpc",
            MMGATE_TRACING__SAMPLE_RATIO="1.0",
        )
    if name in EDGED:
        env["MMGATE_EDGES"] = str(args.edges)
    return [*python, "services.cli", "serve"], env


async def start(
    name: str,
    size: int,
    model: str,
    args: argparse.Namespace,
    extra_env: dict[str, str] | None = None,
) -> Server:
    """The contender's server, serving; ``extra_env``: more of its environment."""
    port = free_port()
    log = tempfile.NamedTemporaryFile(  # noqa: SIM115 - kept open while it runs
        prefix=f"frontend-{name}-", suffix=".log", delete=False
    )
    line, added = command(name, port, size, model, args)
    env = {
        **os.environ,
        "SMG_VLLM_SERVICER_WARMUP": "0",
        "VLLM_LOGGING_LEVEL": "WARNING",
        **added,
        **(extra_env or {}),
    }
    process = await asyncio.create_subprocess_exec(
        *cpus()[0],
        *line,
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
    )
    server = Server(name, port, process, log)
    try:
        await asyncio.wait_for(ready(server), START_TIMEOUT)
    except BaseException:
        print(server.log_tail(), file=sys.stderr)
        await stop(process, 30)
        raise
    return server


async def ready(server: Server) -> None:
    """Until the server answers: gRPC health SERVING, or the OpenAI server's /health."""
    while server.process.returncode is None:
        with contextlib.suppress(grpc.aio.AioRpcError, httpx.HTTPError):
            if PROTOCOL[server.name] == "openai":
                async with httpx.AsyncClient() as client:
                    reply = await client.get(f"http://{server.target}/health", timeout=2)
                    if reply.status_code == 200:
                        return
            else:
                async with grpc.aio.insecure_channel(server.target) as channel:
                    health = health_pb2_grpc.HealthStub(channel)
                    answer = await health.Check(health_pb2.HealthCheckRequest(), timeout=2)
                    if answer.status == health_pb2.HealthCheckResponse.SERVING:
                        return
        await asyncio.sleep(0.2)  # polling a starting server: its port opens late
    raise RuntimeError(f"{server.name} exited:\n{server.log_tail()}")


def only(measured: Server, servers: Sequence[Server]) -> None:
    """The measured server runs; the others (and their engine processes) are stopped meanwhile,
    so that their idle work takes nothing from its core."""
    for server in servers:
        os.killpg(server.process.pid, signal.SIGCONT if server is measured else signal.SIGSTOP)


async def load(
    server: Server, streams: int, model: str, args: argparse.Namespace
) -> dict[str, Any]:
    process = await asyncio.create_subprocess_exec(
        *cpus()[1],
        sys.executable,
        "-m",
        "bench.frontend_load",
        "--protocol",
        PROTOCOL[server.name],
        "--target",
        server.target,
        "--streams",
        str(streams),
        "--seconds",
        str(args.seconds),
        "--warmup",
        str(args.warmup),
        "--model",
        model,
        # the server's front: with edges, the core and its edges (vLLM's engine core and
        # workers left out: they are the GPU's, idle here)
        *(f"--server-pid={pid}" for pid in session_pids(server.process.pid, leaving_out="VLLM::")),
        "--max-tokens",
        str(args.max_tokens),
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await process.communicate()
    if process.returncode != 0:
        raise RuntimeError(f"the load generator failed ({process.returncode}) at {server.name}")
    return dict(json.loads(out.decode().strip().splitlines()[-1]))


def figures(raw: dict[str, Any], streams: int, step_s: float) -> dict[str, Any]:
    seconds = raw["seconds"]
    tokens = raw["tokens"]
    offered = min(streams, MAX_NUM_SEQS) / step_s
    return {
        **raw,
        "offered_tokens_s": offered,
        "tokens_s": tokens / seconds,
        "delivered": tokens / seconds / offered,
        "messages_s": raw["messages"] / seconds,
        "tokens_per_message": tokens / raw["messages"] if raw["messages"] else 0.0,
        "itl_p50_steps": raw["itl_p50"] / step_s,
        "itl_p99_steps": raw["itl_p99"] / step_s,
        "server_cpu_per_1k": raw["server_cpu"] / tokens * 1000 if tokens else float("nan"),
        "core_cpu_per_1k": raw["core_cpu"] / tokens * 1000 if tokens else float("nan"),
        "server_cpu_share": raw["server_cpu"] / seconds,
        "client_cpu_share": raw["client_cpu"] / seconds,
        # the load generator held the run back: it used its whole core, or the server had CPU
        # to spare while the engine's rate went unmet (vLLM's OpenAI server under httpx)
        "client_bound": raw["client_cpu"] / seconds > 0.9
        or (tokens / seconds < 0.9 * offered and raw["server_cpu"] / seconds < 0.85),
    }


def row(name: str, size: int, streams: int, f: dict[str, Any]) -> str:
    notes = ("  client-bound" if f["client_bound"] else "") + (
        f"  errors {f['errors']}" if f["errors"] else ""
    )
    if name in EDGED:  # the core's share of the CPU: what one core process carries
        notes += f"  core {f['core_cpu_per_1k']:.3f} cpu s/1k"
    return (
        f"{name:<16} {size:>4} {streams:>5} {f['tokens_s']:>9,.0f} {f['offered_tokens_s']:>9,.0f}"
        f" {f['delivered']:>6.2f} {f['messages_s']:>8,.0f} {f['tokens_per_message']:>5.1f}"
        f" {f['itl_p50_steps']:>5.2f} {f['itl_p99_steps']:>6.2f}"
        f" {f['ttft_p50'] * 1000:>7.0f} {f['ttft_p99'] * 1000:>7.0f}"
        f" {f['server_cpu_per_1k']:>7.3f} {f['server_cpu_share']:>5.2f}"
        f" {f['client_cpu_share']:>5.2f}{notes}"
    )


HEADER = (
    f"{'contender':<16} {'size':>4} {'S':>5} {'tok/s':>9} {'offered':>9} {'ratio':>6}"
    f" {'msg/s':>8} {'tok/m':>5} {'itl50':>5} {'itl99':>6} {'ttft50':>7} {'ttft99':>7}"
    f" {'cpu/1k':>7} {'srv':>5} {'load':>5}\n"
    f"{'':<16} {'':>4} {'':>5} {'':>9} {'':>9} {'':>6} {'':>8} {'':>5} {'steps':>5} {'steps':>6}"
    f" {'ms':>7} {'ms':>7} {'cpu s':>7} {'core':>5} {'core':>5}"
)


def ratios(results: list[dict[str, Any]]) -> None:
    """mmgate's delivered tokens/s and CPU per 1,000 tokens against each alternative."""
    by = {(r["contender"], r["size"], r["streams"]): r for r in results}
    print("\nmmgate (traced) against each: delivered tokens/s ratio, CPU per 1,000 tokens ratio")
    for (name, size, streams), mine in sorted(by.items(), key=lambda kv: (kv[0][1], kv[0][2])):
        if name not in MMGATES:
            continue
        cells = []
        for other in CONTENDERS:
            theirs = by.get((other, size, streams))
            if other == name or (other in MMGATES and name != "mmgate"):
                continue
            if theirs is not None:
                cells.append(
                    f"{other}: {mine['tokens_s'] / theirs['tokens_s']:.2f}x tok/s,"
                    f" {mine['server_cpu_per_1k'] / theirs['server_cpu_per_1k']:.2f}x cpu"
                )
        print(f"  {name:<13} size {size} S {streams:>4}: " + "; ".join(cells))


def plot(results: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted({r["size"] for r in results})
    figure, axes = plt.subplots(1, len(sizes), figsize=(6 * len(sizes), 4.5), squeeze=False)
    for axis, size in zip(axes[0], sizes, strict=True):
        top = 0.0
        for name in CONTENDERS:
            points = sorted(
                (r["offered_tokens_s"], r["tokens_s"])
                for r in results
                if r["contender"] == name and r["size"] == size
            )
            if points:
                axis.plot(*zip(*points, strict=True), marker="o", label=name)
                top = max(top, *(p[0] for p in points))
        axis.plot([0, top], [0, top], color="grey", linestyle=":", label="the engine's rate")
        axis.set_title(f"{size} token{'s' if size > 1 else ''} a message")
        axis.set_xlabel("offered (the synthetic GPU's) tokens/s")
        axis.set_ylabel("delivered tokens/s")
        axis.legend(fontsize=8)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)


async def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    model = str(prepare_default_model(Settings().model_cache))
    sink = await asyncio.create_subprocess_exec(
        *cpus()[1],
        sys.executable,
        "-m",
        "bench.observability",
        "--sink",
        cwd=ROOT,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert sink.stdout is not None
    assert sink.stdin is not None
    args.otlp_port = int(await asyncio.wait_for(sink.stdout.readline(), 60))
    results: list[dict[str, Any]] = []
    print(HEADER, flush=True)
    try:
        for size in args.sizes:
            servers: list[Server] = []
            try:
                for name in args.contenders:
                    servers.append(await start(name, size, model, args))
                for turn, streams in enumerate(args.streams):
                    shift = turn % len(servers)
                    for server in servers[shift:] + servers[:shift]:
                        only(server, servers)
                        raw = await load(server, streams, model, args)
                        f = figures(raw, streams, args.step_ms / 1000)
                        f.update(contender=server.name, size=size, streams=streams)
                        results.append(f)
                        print(row(server.name, size, streams, f), flush=True)
            finally:
                for server in servers:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(server.process.pid, signal.SIGCONT)
                    await stop(server.process, 60)
                    server.log.close()
    finally:
        sink.stdin.close()
        spans = (await sink.stdout.read()).decode().split()
        await sink.wait()
        print(f"\nspans received from mmgate: {spans[-1] if spans else '?'}")
    ratios(results)
    return results


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])

    def numbers(text: str) -> list[int]:
        return [int(part) for part in text.split(",")]

    parser.add_argument("--streams", type=numbers, default=[64, 256, 1024])
    parser.add_argument("--sizes", type=numbers, default=[1, 4])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=5.0)
    add_timing_options(parser)
    parser.add_argument("--max-tokens", type=int, default=128, help="every request's, exactly")
    parser.add_argument("--edges", type=int, default=2, help="mmgate-edges' edge processes")
    parser.add_argument(
        "--contenders",
        type=lambda text: [name.strip() for name in text.split(",")],
        default=list(CONTENDERS),
        help="a comma-separated list of: " + ", ".join(CONTENDERS),
    )
    parser.add_argument("--json", type=Path)
    parser.add_argument("--plot", type=Path)
    args = parser.parse_args(argv)
    unknown = set(args.contenders) - set(CONTENDERS)
    if unknown:
        parser.error(f"unknown contenders: {', '.join(sorted(unknown))}")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    started = time.perf_counter()
    results = asyncio.run(run(args))
    print(f"\nwall time {time.perf_counter() - started:.0f} s")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        about = {k: v for k, v in vars(args).items() if k not in ("json", "plot")}
        args.json.write_text(json.dumps({"about": about, "results": results}, indent=1))
    if args.plot is not None:
        plot(results, args.plot)


if __name__ == "__main__":
    main()
