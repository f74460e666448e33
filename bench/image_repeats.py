"""Repeated images: mmgate against vLLM's own server, by repeats, prompt layout and working set.

    python -m bench.image_repeats [--model tiny|vitl] [--requests 30] [--repeats 0 0.5 0.9]
                                  [--working-sets 4] [--layouts shared per-request]
                                  [--contenders mmgate vllm-base64 vllm-uuid] [--json F]
                                  [--runs 3] [--servers 2] [--interleave [--block 1]]
                                  [--pin CPU]

Contenders, one server at a time (side by side with ``--interleave``), each on a fresh engine
with the same engine arguments (``engine_settings(model)``: float32, the model's context) and the
same image limit:
  mmgate        ``mmgate serve`` (embeddings mode: mmgate decodes, runs the encoder and caches
                the output; the caches on), called by ``MmgateClient``, which sends an image's
                bytes the first time and its digest afterwards
  vllm-base64   ``vllm.entrypoints.openai.api_server``, streaming chat completions with each
                image as a base64 data URL (``image_url``), vLLM's own caches on (processor
                cache, encoder cache, prefix cache)
  vllm-uuid     the same with a per-image ``uuid`` beside the data URL: vLLM's way to skip
                hashing and processing an image it has seen

Layouts: ``shared``: a shared system prompt (~150 tokens), then the image, then the question:
vLLM's prefix cache can cover a repeated image's tokens; ``per-request``: a line of text of the
request's own, then the image: no prefix cache can cover it.

Each case (layout, working set W, repeat ratio R) has images of its own: W images sent once first
(unmeasured: the working set is then "seen"), then --requests requests one at a time, each with a
new image (share 1-R) or one of the W drawn at random (share R, a fixed seed: the same sequence for
every contender). Then a burst: 8 requests with the same new image, sent together. Real JPEGs of
a realistic size (1024x768 photo-like, ~100 KB), greedy, 8 new tokens.

``--runs N`` repeats the whole run N times (fresh servers, the contenders' order turned) and
prints how far each ratio's runs are from their median. ``--servers K`` measures each contender
on K fresh servers in a run and pools their figures: a server can keep a level of its own for
its life (one vLLM server was ~10% slower than the other sides in every stretch of a case), and
one server a side then moves a ratio by that much. ``--interleave`` starts every contender's
server at once and sends a case's requests to each side in turn (in blocks of ``--block``, the
order reversed block by block: A B, B A, ...), so that the host's drift, which on a 2-vCPU VM
moves TTFT by 10-30% within seconds, hits all sides alike. Only the side asked has its engine
running: the others' engine processes are stopped (SIGSTOP) until their turn, since vLLM's CPU
worker and engine core busy-wait a second after each step and, on two vCPUs, every server's
worker is bound to the same CPU (sent side after side without that, every side's requests/s
fell 6-fold).

``--pin CPU`` (``make bench-image-repeats`` pins CPU 0) leaves vLLM's CPU worker that CPU alone
and puts everything else (this client, the servers' front ends and engine cores) on the others.
Unpinned, on two vCPUs, TTFT had two modes ~12 ms apart that came and went in stretches of
seconds, and a case's p50 landed in either: a ratio moved up to 3.4x between runs. The absolute
times are higher pinned (the front ends share one CPU with the client), the same for every side.
Each case's images are made before its clock starts.

Printed per case and contender: TTFT p50/p99, requests/s, bytes sent per request, and what each
side counts: mmgate its decodes and encoder runs (its Cache.GetStats MediaStats, before and
after); vLLM its processor-cache queries and hits (``vllm:mm_cache_*``) and prefix-cache hits
(``vllm:prefix_cache_*``): vLLM exports no count of image decodes or encoder runs.
Goals at R=0.9, TTFT p50 vLLM / mmgate: >= 2x with the tiny model; >= 5x with the ViT-L-sized
tower when W is larger than vLLM's encoder cache (its size is printed from the engine's config).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import json
import os
import random
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import psutil

from services.client import build_request
from services.config import EngineSettings, default_model_cache
from services.models import build_tiny_llava, build_vitl_llava, engine_settings
from services.wire import IMAGE_PLACEHOLDER

from .images import ENV, photo
from .openai_server import OpenAIServer, tree_rss_bytes
from .service import Mmgate, percentile

MAX_TOKENS = 8
BURST = 8
BURSTS = 3  # per case, one after the other: the first of a server's bursts shows warm-up
SIZE = (1024, 768)
AGREE = 0.10  # runs agree when every run's ratio is within this of their median
SYSTEM = (
    "You are a careful assistant for a photo library. Describe what a picture shows: the main "
    "subject first, then the setting, the colours and the light, then anything unusual. Keep to "
    "what can be seen; do not guess names, places or dates. Answer in plain sentences, without "
    "lists or headings, and in the language of the question. When a picture is unclear, say so "
    "and describe what can still be made out. Never invent text that the picture does not show, "
    "and never describe people by anything but what they wear and do."
)


@dataclass
class Figures:
    ttft: list[float] = field(default_factory=list)
    sent: list[int] = field(default_factory=list)
    wall: float = 0.0
    counts: dict[str, float] = field(default_factory=dict)
    each: list[float] = field(default_factory=list)  # a burst's p50, burst by burst (ms)

    def ms(self, q: float) -> float:
        return percentile(self.ttft, q) * 1000

    def add(self, more: Figures) -> None:
        """``more`` pooled into these: the same case on another server."""
        self.ttft += more.ttft
        self.sent += more.sent
        self.wall += more.wall
        self.each += more.each
        self.counts = {k: self.counts.get(k, 0.0) + v for k, v in more.counts.items()}

    def summary(self) -> dict[str, Any]:
        return {
            "requests": len(self.ttft),
            "ttft_p50_ms": self.ms(0.5),
            "ttft_p99_ms": self.ms(0.99),
            "requests_per_s": len(self.ttft) / self.wall if self.wall else float("nan"),
            "bytes_per_request": sum(self.sent) / len(self.sent) if self.sent else 0,
            "counts": self.counts,
            "p50_each_ms": self.each,
            "ttft_ms": [round(t * 1000, 2) for t in self.ttft],  # in the order sent
        }


class Side(Protocol):
    name: str

    async def start(self) -> float: ...
    async def ask(self, image: bytes, layout: str, n: int) -> tuple[float, int]: ...
    async def counts(self) -> dict[str, float]: ...
    async def close(self) -> None: ...


def question(n: int) -> str:
    return f"Question {n}: what is in this picture?"


class MmgateSide:
    def __init__(self, model: Path, engine: dict[str, Any], mode: str = "embeddings") -> None:
        self.name = "mmgate" if mode == "embeddings" else f"mmgate-{mode}"
        env = {
            "MMGATE_MEDIA__MODE": mode,
            "MMGATE_ENGINE__MAX_MODEL_LEN": str(engine["max_model_len"]),
            "MMGATE_ENGINE__KV_CACHE_MEMORY_BYTES": str(engine["kv_cache_memory_bytes"]),
            "MMGATE_ENGINE__DTYPE": engine["dtype"],
            "MMGATE_CACHE__MAX_BYTES": str(4 * 2**30),
            # a port of its own: with --interleave two mmgate servers run at once
            "MMGATE_METRICS__PORT": "0",
        }
        self.server = Mmgate(str(model), env)

    async def start(self) -> float:
        return await self.server.start()

    async def ask(self, image: bytes, layout: str, n: int) -> tuple[float, int]:
        client = self.server.client
        if layout == "shared":
            request = build_request(
                f"{IMAGE_PLACEHOLDER}\n{question(n)}",
                messages=[("system", SYSTEM)],
                images=[image],
                max_tokens=MAX_TOKENS,
                temperature=0.0,
                ignore_eos=True,
            )
        else:
            request = build_request(
                f"Request {n} from the archive, file {n * 7919 % 10007}: "
                f"{IMAGE_PLACEHOLDER}\n{question(n)}",
                images=[image],
                max_tokens=MAX_TOKENS,
                temperature=0.0,
                ignore_eos=True,
            )
        slim = client.held.by_reference(request)
        sent = (slim or request).ByteSize()
        started = time.perf_counter()
        ttft = 0.0
        async for event in client.generate(request):
            if event.HasField("delta") and not ttft:
                ttft = time.perf_counter() - started
            if event.HasField("final"):
                assert event.final.usage.completion_tokens == MAX_TOKENS
        return ttft, sent

    async def counts(self) -> dict[str, float]:
        """The server's own count of its work (Cache.GetStats' MediaStats)."""
        media = (await self.server.client.stats()).media
        return {"decodes": float(media.decodes), "encoder runs": float(media.encodes)}

    async def close(self) -> None:
        await self.server.close()


class VllmSide:
    def __init__(self, model: Path, engine: dict[str, Any], *, uuids: bool) -> None:
        settings = EngineSettings(**engine)
        self.server = OpenAIServer(settings, str(model), images=1)
        self.uuids = uuids
        self.name = "vllm-uuid" if uuids else "vllm-base64"

    async def start(self) -> float:
        return await self.server.start(ENV)

    async def ask(self, image: bytes, layout: str, n: int) -> tuple[float, int]:
        part: dict[str, Any] = {
            "type": "image_url",
            "image_url": {"url": "data:image/jpeg;base64," + base64.b64encode(image).decode()},
        }
        if self.uuids:
            part["uuid"] = hashlib.sha256(image).hexdigest()
        text = {"type": "text", "text": question(n)}
        if layout == "shared":
            content = [part, text]
            system: str | None = SYSTEM
        else:
            intro = f"Request {n} from the archive, file {n * 7919 % 10007}: "
            content = [{"type": "text", "text": intro}, part, text]
            system = None
        ttft, tokens, sent = await self.server.chat(content, max_tokens=MAX_TOKENS, system=system)
        assert len(tokens) == MAX_TOKENS, tokens
        return ttft, sent

    async def counts(self) -> dict[str, float]:
        m = await self.server.metrics()
        return {
            "processor cache queries": m.get("vllm:mm_cache_queries_total", float("nan")),
            "processor cache hits": m.get("vllm:mm_cache_hits_total", float("nan")),
            "prefix cache queried tokens": m.get("vllm:prefix_cache_queries_total", float("nan")),
            "prefix cache hit tokens": m.get("vllm:prefix_cache_hits_total", float("nan")),
        }

    async def close(self) -> None:
        await self.server.close()


@dataclass(frozen=True, slots=True)
class Case:
    layout: str
    working_set: int
    repeat: float

    @property
    def label(self) -> str:
        return f"{self.layout}, W={self.working_set}, {self.repeat:.0%} repeats"


def plan(case: Case, requests: int, first_seed: int) -> tuple[list[int], list[int]]:
    """The working set's image seeds, and each measured request's (new or a repeat)."""
    rng = random.Random(f"{case.label}")
    working = [first_seed + i for i in range(case.working_set)]
    fresh = first_seed + case.working_set
    sequence: list[int] = []
    # exactly round(R x N) repeats, in a shuffled order: the same for every contender
    repeats = round(case.repeat * requests)
    kinds = [True] * repeats + [False] * (requests - repeats)
    rng.shuffle(kinds)
    for repeat in kinds:
        if repeat:
            sequence.append(rng.choice(working))
        else:
            sequence.append(fresh)
            fresh += 1
    return working, sequence


def subtract(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before.get(k, 0.0) for k in after}


def schedule(requests: int, sides: int, block: int) -> list[tuple[int, range]]:
    """(side, requests) in the order sent: the case's requests in blocks of ``block``, each block
    sent to every side, the sides' order reversed from one block to the next (A B, B A, A B, ...),
    so that the host's drift over a case weighs on every side alike."""
    order: list[tuple[int, range]] = []
    for k, first in enumerate(range(0, requests, block)):
        span = range(first, min(first + block, requests))
        turn = list(range(sides)) if k % 2 == 0 else list(range(sides))[::-1]
        order += [(side, span) for side in turn]
    return order


class Freezer:
    """Only the side being asked has its engine running: the other servers' engine processes
    (engine core and CPU worker: the server's descendants) are stopped (SIGSTOP) until their turn.

    After each step vLLM's CPU worker and its engine core busy-poll (``sched_yield``) for up to a
    second for the next (``busy_loop_s = 1`` in vllm/distributed/device_communicators/
    shm_broadcast.py), and where the servers' workers share a CPU (two vCPUs: all of them) the
    next server's would run beside that loop: sent side after side without this, every side's
    requests/s fell 6-fold. Stopped, an idle engine costs nothing; resumed, it goes on where it
    was. The front ends keep running (idle), so each server answers as it would alone."""

    def __init__(self) -> None:
        self.engines: dict[str, list[int]] = {}
        self.running: str | None = None

    def add(self, side: Side) -> None:
        """A server just started: it runs, the one that ran before stops."""
        self.engines[side.name] = engine_pids(side)
        self.turn_to(side)

    def turn_to(self, side: Side) -> None:
        if self.running == side.name:
            return
        if self.running is not None:
            signal_all(self.engines[self.running], signal.SIGSTOP)
        signal_all(self.engines.get(side.name, []), signal.SIGCONT)
        self.running = side.name

    def thaw(self) -> None:
        for pids in self.engines.values():
            signal_all(pids, signal.SIGCONT)
        self.running = None


def engine_pids(side: Side) -> list[int]:
    pid = getattr(getattr(side, "server", None), "pid", None)
    if pid is None:
        return []
    return [child.pid for child in psutil.Process(pid).children(recursive=True)]


def signal_all(pids: Sequence[int], sig: signal.Signals) -> None:
    """``sig`` to each of ``pids`` still there; for SIGSTOP, back once each is stopped."""
    alive = []
    for pid in pids:
        try:
            os.kill(pid, sig)
            alive.append(pid)
        except ProcessLookupError:
            continue  # gone with its server: nothing to stop or resume
    if sig != signal.SIGSTOP:
        return
    deadline = time.monotonic() + 1.0
    for process in map(psutil.Process, alive):
        while process.status() != psutil.STATUS_STOPPED:  # delivered within microseconds
            if time.monotonic() > deadline:
                raise RuntimeError(f"engine process {process.pid} did not stop")
            time.sleep(0.0001)


async def run_case(
    sides: Sequence[Side],
    case: Case,
    requests: int,
    first_seed: int,
    images: dict[int, bytes],
    block: int = 1,
    freezer: Freezer | None = None,
) -> dict[str, tuple[Figures, Figures]]:
    """One case on each of ``sides``: its measured requests in blocks, each block sent to every
    side in turn (``schedule``), only the side asked running its engine (``freezer``); then each
    side's bursts. A side's req/s: its requests over the time they took."""

    def image(seed: int) -> bytes:
        if seed not in images:
            images[seed] = photo(seed, SIZE)
        return images[seed]

    freezer = freezer or Freezer()
    working, sequence = plan(case, requests, first_seed)
    for seed in sequence:  # made before the clock starts: a JPEG takes ~10 ms to make here
        image(seed)
    for side in sides:
        freezer.turn_to(side)
        for n, seed in enumerate(working):
            await side.ask(image(seed), case.layout, -1 - n)
    before = {}
    for side in sides:
        freezer.turn_to(side)
        before[side.name] = await side.counts()
    figures = {side.name: Figures() for side in sides}
    for index, span in schedule(len(sequence), len(sides), block):
        side = sides[index]
        freezer.turn_to(side)
        mine = figures[side.name]
        for n in span:
            started = time.perf_counter()
            ttft, sent = await side.ask(image(sequence[n]), case.layout, n)
            mine.wall += time.perf_counter() - started
            mine.ttft.append(ttft)
            mine.sent.append(sent)
    out = {}
    for side in sides:
        freezer.turn_to(side)
        figures[side.name].counts = subtract(await side.counts(), before[side.name])
        out[side.name] = (figures[side.name], await bursts(side, case, first_seed, image))
    return out


async def bursts(side: Side, case: Case, first_seed: int, image: Any) -> Figures:
    """BURSTS bursts of BURST requests sent together, each burst with a new image of its own."""
    burst = Figures()
    before = await side.counts()
    for k in range(BURSTS):
        same = image(first_seed + 10_000 + k)
        started = time.perf_counter()
        answers = await asyncio.gather(
            *(side.ask(same, case.layout, 1000 + 100 * k + n) for n in range(BURST))
        )
        burst.wall += time.perf_counter() - started
        ttfts = [ttft for ttft, _ in answers]
        burst.ttft += ttfts
        burst.each.append(percentile(ttfts, 0.5) * 1000)
        burst.sent += [sent for _, sent in answers]
    burst.counts = subtract(await side.counts(), before)
    return burst


def make_side(name: str, model: Path, engine: dict[str, Any]) -> Side:
    if name == "mmgate":
        return MmgateSide(model, engine)
    if name.startswith("mmgate-"):
        return MmgateSide(model, engine, mode=name.removeprefix("mmgate-"))
    return VllmSide(model, engine, uuids=name == "vllm-uuid")


def encoder_cache_tokens(model: Path, engine: dict[str, Any], image_tokens: int) -> int | None:
    """vLLM's encoder cache size in tokens for these engine arguments (its scheduler's config)."""
    try:
        from vllm.engine.arg_utils import EngineArgs

        config = EngineArgs(
            model=str(model),
            dtype=engine["dtype"],
            max_model_len=engine["max_model_len"],
            kv_cache_memory_bytes=engine["kv_cache_memory_bytes"],
            enforce_eager=True,
            limit_mm_per_prompt={"image": 1},
        ).create_engine_config()
        # vllm/v1/core/encoder_cache_manager.py: at least one item's tokens
        return max(int(config.scheduler_config.encoder_cache_size), image_tokens)
    except Exception as error:  # noqa: BLE001 - a vLLM without that field: say so, measure anyway
        print(f"vLLM's encoder cache size unknown here: {error}", file=sys.stderr)
        return None


def pin(engine_cpu: int) -> None:
    """vLLM's CPU worker on ``engine_cpu`` alone, everything else on the other CPUs: this
    process (the client) and the servers' front ends and engine cores, which inherit its CPUs;
    but mmgate's encoders (embeddings mode) run on ``engine_cpu`` too
    (``MMGATE_THREADS__ENCODE_CPUS``), as vLLM's tower runs in its worker: each side's tower on
    the same CPU, with the same neighbours (its own engine idle, waiting for the embeddings).

    vLLM binds its worker to a CPU of its own choosing and leaves the others' placement to the
    kernel; after each step the worker spins (``sched_yield``) for up to a second waiting for
    the next, so a thread the kernel puts on that CPU waits behind it for a time slice: the
    slow mode of the module's docstring."""
    others = set(os.sched_getaffinity(0)) - {engine_cpu}
    if not others:
        print(f"not pinned: no CPU but {engine_cpu} to leave to the client and the servers")
        return
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = str(engine_cpu)
    os.environ["MMGATE_THREADS__ENCODE_CPUS"] = f"[{engine_cpu}]"
    os.sched_setaffinity(0, others)
    print(
        f"pinned: the engine's worker and mmgate's encoders on CPU {engine_cpu},"
        f" the rest on {sorted(others)}"
    )


def prepare(args: argparse.Namespace) -> None:
    """The servers' environment (bench/images.py's ``ENV``, where not set) and, with ``--pin``,
    the CPUs: what a side-by-side run sets before it starts anything."""
    for name, value in ENV.items():
        os.environ.setdefault(name, value)
    if args.pin is not None:
        pin(args.pin)


async def main(args: argparse.Namespace) -> None:
    prepare(args)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        if args.model_path is not None:
            model = args.model_path
        elif args.model == "vitl":
            # 1.2 GB: built once beside the converted models, not again for every run
            model = build_vitl_llava(default_model_cache() / "vitl-llava")
        else:
            model = build_tiny_llava(Path(tmp) / "tiny-llava")
        engine = engine_settings(model, max_model_len=2048 if args.model == "vitl" else 512)
        tokens = 576 if args.model == "vitl" else 16
        cache = encoder_cache_tokens(model, engine, tokens)
        held = f"{cache // tokens} images of {tokens} tokens" if cache else "unknown"
        print(f"model {args.model} ({model}); vLLM's encoder cache: {cache} tokens = {held}")
        cases = [
            Case(layout, w, r)
            for layout in args.layouts
            for w in args.working_sets
            for r in args.repeats
        ]
        images: dict[int, bytes] = {}

        async def sides(order: list[str], pooled: Pooled, servers: Servers) -> None:
            await run_sides(order, model, engine, cases, args, images, pooled, servers)

        runs = await measured_runs(args, sides)
    print(f"\nwhole run: {time.perf_counter() - started:.0f} s")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        about = {
            "model": args.model,
            "requests": args.requests,
            "encoder_cache_tokens": cache,
            "runs": args.runs,
            "servers_per_run": args.servers,
            "interleaved": args.interleave,
        }
        # "results": the first run (what bench/plots.py tables), "runs": every one
        document = {"about": about, "results": runs[0], "runs": runs}
        args.json.write_text(json.dumps(document, indent=1))
        print(f"figures written to {args.json}")


Pooled = dict[str, dict[str, tuple[Figures, Figures]]]  # case -> side -> (requests, bursts)


async def run_sides(
    names: Sequence[str],
    model: Path,
    engine: dict[str, Any],
    cases: list[Case],
    args: argparse.Namespace,
    images: dict[int, bytes],
    pooled: Pooled,
    servers: dict[str, list[dict[str, float]]],
) -> None:
    """Contenders on fresh servers, started together and measured case by case (interleaved
    when there are several); each side's figures pooled with its earlier servers' in the run."""
    sides = [make_side(name, model, engine) for name in names]
    freezer = Freezer()
    try:
        for side in sides:
            start_s = await side.start()
            print(f"{side.name}: serving in {start_s:.1f} s", flush=True)
            servers.setdefault(side.name, []).append({"start_s": start_s})
            freezer.add(side)
            for warm in range(3):  # the engine's and the client's first requests
                await side.ask(photo(900_000 + warm, SIZE), "shared", -100 - warm)
        for k, case in enumerate(cases):
            measured = await run_case(
                sides, case, args.requests, 1_000 + 100_000 * k, images, args.block, freezer
            )
            for name, (figures, burst) in measured.items():
                print(
                    f"  {name:<13} {case.label:<34} TTFT p50 {figures.ms(0.5):8.1f} ms "
                    f"p99 {figures.ms(0.99):8.1f} ms  "
                    f"{figures.summary()['requests_per_s']:.2f} req/s  "
                    f"{figures.summary()['bytes_per_request']:9.0f} B/req  "
                    f"{figures.counts}  | bursts of {BURST}: p50 "
                    f"{' '.join(f'{ms:.0f}' for ms in burst.each)} ms {burst.counts}",
                    flush=True,
                )
                if name in pooled.setdefault(case.label, {}):
                    pooled[case.label][name][0].add(figures)
                    pooled[case.label][name][1].add(burst)
                else:
                    pooled[case.label][name] = (figures, burst)
        for side in sides:
            rss = tree_rss_bytes(side.server.pid)  # type: ignore[attr-defined]
            servers[side.name][-1]["rss_bytes"] = rss
    finally:
        freezer.thaw()
        for side in sides:
            await side.close()


def ratios(results: dict[str, dict[str, Any]]) -> dict[tuple[str, str, str], float]:
    """(case, "mmgate side vs vLLM side", figure) -> ratio, above 1 where mmgate's side is
    better: vLLM's TTFT p50 / mmgate's, mmgate's requests/s / vLLM's."""
    out: dict[tuple[str, str, str], float] = {}
    for label, sides in results.items():
        if label.startswith("_"):
            continue
        for mine in (name for name in sides if name.startswith("mmgate")):
            for theirs in (name for name in sides if name.startswith("vllm")):
                ours, other = sides[mine]["run"], sides[theirs]["run"]
                pair = f"{mine} vs {theirs}"
                out[(label, pair, "TTFT p50")] = other["ttft_p50_ms"] / ours["ttft_p50_ms"]
                out[(label, pair, "req/s")] = ours["requests_per_s"] / other["requests_per_s"]
    return out


def report(results: dict[str, dict[str, Any]], title: str) -> None:
    print(f"\n{title}: vLLM's TTFT p50 / mmgate's, mmgate's req/s / vLLM's (above 1: mmgate's)")
    for (label, pair, figure), value in ratios(results).items():
        print(f"  {label:<34} {pair:<30} {figure:<9} {value:6.2f}x")


def agreement(runs: list[dict[str, dict[str, Any]]]) -> None:
    """Each ratio across the runs: how far the farthest run is from their median (the runs
    agree within +-10% when that is at most 10%), and max / min - 1."""
    print(f"\neach ratio over {len(runs)} runs: values, farthest from the median, max / min - 1")
    every = [ratios(results) for results in runs]
    worst, agreed = 0.0, 0
    for key in every[0]:
        values = [found[key] for found in every if key in found]
        farthest = from_median(values)
        worst = max(worst, farthest)
        agreed += farthest <= AGREE
        label, pair, figure = key
        shown = " ".join(f"{v:.2f}" for v in values)
        spread = max(values) / min(values) - 1
        print(f"  {label:<34} {pair:<30} {figure:<9} {shown}  ±{farthest:.0%}  ({spread:.0%})")
    total = len(every[0])
    print(f"  within ±{AGREE:.0%} of their median: {agreed} of {total}; farthest ±{worst:.0%}")


def from_median(values: Sequence[float]) -> float:
    """How far the farthest of ``values`` is from their median, as a share of it."""
    middle = statistics.median(values)
    return max(abs(v / middle - 1) for v in values)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--model", choices=["tiny", "vitl"], default="tiny")
    parser.add_argument("--model-path", type=Path, default=None, help="a model already built")
    parser.add_argument("--requests", type=int, default=30)
    parser.add_argument("--repeats", type=float, nargs="+", default=[0.0, 0.5, 0.9])
    parser.add_argument("--working-sets", type=int, nargs="+", default=[4])
    parser.add_argument("--layouts", nargs="+", default=["shared", "per-request"])
    parser.add_argument(
        "--contenders",
        nargs="+",
        choices=["mmgate", "mmgate-auto", "mmgate-pixels", "vllm-base64", "vllm-uuid"],
        default=["mmgate", "vllm-base64", "vllm-uuid"],
    )
    add_run_options(parser)
    return parser.parse_args(argv)


Servers = dict[str, list[dict[str, float]]]  # a contender's servers' start figures


async def measured_runs(
    args: argparse.Namespace, sides: Callable[[list[str], Pooled, Servers], Awaitable[None]]
) -> list[dict[str, dict[str, Any]]]:
    """``--runs`` whole runs, each of ``--servers`` fresh servers a contender, the contenders
    in a turned order each time (no side always goes first), all at once (``--interleave``) or
    one after another; each run's figures reported, and how far the runs agree."""
    runs: list[dict[str, dict[str, Any]]] = []
    for run in range(args.runs):
        pooled: Pooled = {}
        servers: Servers = {}
        for k in range(args.servers):
            turn = (run * args.servers + k) % len(args.contenders)
            order = args.contenders[turn:] + args.contenders[:turn]
            if args.interleave:
                await sides(order, pooled, servers)
            else:
                for name in order:
                    await sides([name], pooled, servers)
        results: dict[str, dict[str, Any]] = {"_servers": servers}
        for label, sided in pooled.items():
            results[label] = {
                name: {"run": figures.summary(), "burst": burst.summary()}
                for name, (figures, burst) in sided.items()
            }
        runs.append(results)
        report(results, f"run {run + 1} of {args.runs}")
    if len(runs) > 1:
        agreement(runs)
    return runs


def add_run_options(parser: argparse.ArgumentParser) -> None:
    """How a side-by-side run is made, for this benchmark and the clips' (video_repeats.py)."""
    parser.add_argument("--runs", type=int, default=1, help="whole runs, contenders turned")
    parser.add_argument(
        "--interleave",
        action="store_true",
        help="every contender's server up at once, their requests interleaved case by case",
    )
    parser.add_argument(
        "--servers",
        type=int,
        default=1,
        help="fresh servers a contender is measured on in each run, its figures pooled",
    )
    parser.add_argument(
        "--block", type=int, default=1, help="with --interleave: requests a side is sent in a row"
    )
    parser.add_argument(
        "--pin",
        type=int,
        default=None,
        metavar="CPU",
        help="the engine's worker alone on this CPU, the client and the servers on the others",
    )
    parser.add_argument("--json", type=Path, default=None)


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
