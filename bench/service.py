"""What mmgate's gRPC front costs against vLLM's ``AsyncLLM`` used in-process, measured in one run.

    python -m bench.service [--requests-per-level N] [--cache-policy bypass|prompt|both]
        [--contenders ...] [--rounds N] [--dtype D] [--stream-intervals 1 4]
    python -m bench.service --compare-compilation      (in-process only: eager vs compiled)
                                                        (make bench-service)

Contenders, run one after the other (never two engines at once), each on its own fresh engine
with the same arguments: ``EngineWorker(Settings().engine, model).engine_args()``, i.e. mmgate's
defaults (float32 on a CPU, max_model_len 2048, max_num_seqs 32, 1 GiB of KV cache, enforce_eager):
  in-process   ``AsyncLLM.from_engine_args`` in this process; each request renders the chat
               template and tokenizes (as mmgate does) and passes the ids as a ``TokensPrompt``,
               SamplingParams(max_tokens=64, temperature=0, ignore_eos=True, DELTA outputs)
  mmgate       a real ``mmgate serve`` child process, called over loopback gRPC by
               ``MmgateClient.generate`` with ``build_request(prompt, max_tokens=64,
               temperature=0.0, ignore_eos=True, cache_policy=...)``; ``bypass`` keeps the cache
               actor out of the way, the default policy ``prompt`` sends every request through
               an actor flight (each prompt is new, so each is a miss: render + tokenize + store)
  vllm-serve   vLLM's OpenAI-compatible server with the same engine arguments, over loopback
               HTTP streaming (bench/openai_server.py)
  vllm-grpc    vLLM's own gRPC server (``vllm serve --grpc``) with the same engine arguments,
               over loopback gRPC streaming (bench/vllm_grpc.py): the transport without mmgate

Load: for each concurrency level (1, 4, 16), a closed loop: N workers, each sending its next
request as soon as its last one finished, until the level's requests are done. Every request
has its own prompt ("Question {i} (tag): tell me about topic {i}."), the same list for every
contender, so vLLM's prefix cache helps both sides alike; every contender first serves
``--warmup`` requests at the highest level's concurrency that are not measured. Per level:
  throughput   output tokens of all the level's requests / the level's wall time
  TTFT         from the moment the client starts a request (render or build it, send it) to
               the first token delta it receives; p50 and p99 over the level's requests

ratios: mmgate tok/s / in-process tok/s (below 1: mmgate is slower); TTFT: mmgate's p50 minus
in-process's in ms, and their ratio. Goals: mmgate >= 0.95x in-process throughput at every
level, and TTFT p50 at concurrency 1 within 3 ms of in-process. Also printed, to tell where
mmgate's time goes: the prompt stage's time (in-process: timed around its inline render;
mmgate: as the server reports it in GenerateFinal.cache.lookups), and the CPU time per request
of the processes outside vLLM's engine core (in-process: this one; mmgate: this one, the client,
and the server's main process, read from /proc): with few cores, that CPU is the engine's loss.
Every output is checked to hold 64 tokens, and the same prompts' tokens are compared. Each level
also records how much of the machine's CPU went to other processes than this one and its
descendants, and to the hypervisor (steal): a level above 3% is flagged as disturbed, since on a
small shared machine that moves the figures by more than the goals' margins.

--stream-intervals runs every contender at each of vLLM's ``stream_interval`` values (tokens per
streamed message; ``MMGATE_ENGINE__STREAM_INTERVAL`` for mmgate, ``--stream-interval`` for vLLM's
servers), and prints each mmgate row against the others at the same interval and against mmgate
at interval 1.

--compare-compilation measures the in-process contender alone, once with enforce_eager=True
and once with vLLM's default compilation (enforce_eager=False): engine start time, warm-up time
and throughput at concurrency 1 and 16, printed as compiled / eager ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Protocol

from services.client import MmgateClient, build_request
from services.config import EngineSettings, Settings
from services.engine.plan import EnginePlan
from services.engine.worker import EngineWorker
from services.models import resolve_model
from services.proto.mmgate.v1.inference_pb2 import GenerateRequest
from tests.support import free_port, wait_serving

from .openai_server import OpenAIServer, descendants, shut_down, tree_rss_bytes
from .vllm_grpc import VllmGrpcServer, chat_token_ids

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM

ROOT = Path(__file__).resolve().parents[1]
LEVELS = (1, 4, 16, 64)
MAX_TOKENS = 64
START_TIMEOUT = 300.0
STOP_TIMEOUT = 90.0
# a level during which other processes or the hypervisor took more of the CPU is flagged
DISTURBED = 0.03
# the same for this process (in-process engine) and the server it starts; the caller's own
# values of these win
ENV = {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "VLLM_LOGGING_LEVEL": "WARNING"}


def prompt_text(i: int, tag: str) -> str:
    return f"Question {i} ({tag}): tell me about topic {i}."


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between the closest ranks (numpy's default)."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = (len(ordered) - 1) * q
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass(frozen=True, slots=True)
class Sample:
    ttft: float  # seconds
    token_ids: tuple[int, ...]
    # from the start of the request to its last token, seconds
    e2e: float = float("nan")
    # render + tokenize: in-process, timed here; mmgate, its prompt stage as the server reports
    # it (GenerateFinal.cache.lookups[stage=prompt].wait_ms; through the actor for "prompt")
    prompt_ms: float | None = None
    bytes_sent: int = 0


@dataclass
class Level:
    concurrency: int
    wall: float
    samples: dict[int, Sample] = field(default_factory=dict)
    # CPU seconds the level took in each process outside the engine core (see cpu_seconds)
    cpu: dict[str, float] = field(default_factory=dict)
    # share of the machine's CPU time that went to processes other than this one and its
    # descendants (the engines and the server), and to the hypervisor (steal): disturbance
    others: float = float("nan")
    steal: float = float("nan")
    # context switches the level took in each role's processes, every thread: (voluntary,
    # involuntary). The engine's involuntary ones are the front end's cost made visible: on a
    # small machine each is a thread of the model's step put off a core by another process
    switches: dict[str, tuple[int, int]] = field(default_factory=dict)

    @property
    def tokens(self) -> int:
        return sum(len(s.token_ids) for s in self.samples.values())

    @property
    def throughput(self) -> float:
        return self.tokens / self.wall

    def ttft_ms(self, q: float) -> float:
        return percentile([s.ttft for s in self.samples.values()], q) * 1000

    def e2e_ms(self, q: float) -> float:
        return percentile([s.e2e for s in self.samples.values()], q) * 1000

    def prompt_ms(self, q: float) -> float:
        times = [s.prompt_ms for s in self.samples.values() if s.prompt_ms is not None]
        return percentile(times, q)

    def cpu_ms_per_request(self) -> dict[str, float]:
        return {name: seconds * 1000 / len(self.samples) for name, seconds in self.cpu.items()}

    def switches_per_request(self) -> dict[str, dict[str, float]]:
        n = len(self.samples)
        return {
            role: {"voluntary": v / n, "involuntary": i / n}
            for role, (v, i) in self.switches.items()
        }


Send = Callable[[int], Awaitable[Sample]]
# the requests measured at a concurrency level
Count = Callable[[int], int]
CpuClock = Callable[[], dict[str, float]]
# the processes of each role ("client", "server", "engine") of a contender
Roles = Callable[[], dict[str, list[int]]]


def context_switches(pids: Sequence[int]) -> tuple[int, int]:
    """Voluntary and involuntary context switches of every thread of ``pids`` so far (Linux)."""
    voluntary = involuntary = 0
    for pid in pids:
        for status in Path(f"/proc/{pid}/task").glob("*/status"):
            try:
                lines = status.read_text().splitlines()
            except OSError:  # gone meanwhile
                continue
            for line in lines:
                if line.startswith("voluntary_ctxt_switches:"):
                    voluntary += int(line.split()[1])
                elif line.startswith("nonvoluntary_ctxt_switches:"):
                    involuntary += int(line.split()[1])
    return voluntary, involuntary


def _stat_fields(pid: int | str) -> list[str]:
    """/proc/PID/stat from the state on (field 3): ppid is [1], utime [11], stime [12]."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def session_pids(leader: int, *, leaving_out: str) -> list[int]:
    """The session's processes (a server started in a session of its own, with what it started),
    the leader first, less those whose command line holds ``leaving_out``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == leader:
            continue
        try:
            if int(_stat_fields(entry.name)[3]) != leader:
                continue
            line = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (FileNotFoundError, ProcessLookupError):
            continue  # gone meanwhile
        if leaving_out not in line:
            found.append(int(entry.name))
    return [leader, *sorted(found)]


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of one process, all its threads, not its children (Linux)."""
    fields = _stat_fields(pid)
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True, slots=True)
class MachineTimes:
    busy: float  # CPU seconds the whole machine spent busy (user, nice, system, irq, softirq)
    steal: float  # taken by the hypervisor
    ours: float  # spent by this process and all its descendants

    @staticmethod
    def now() -> MachineTimes | None:
        """None where /proc does not tell (not Linux)."""
        try:
            ticks = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
            parents: dict[int, int] = {}
            cpu: dict[int, int] = {}
            for entry in Path("/proc").iterdir():
                if entry.name.isdigit():
                    try:
                        fields = _stat_fields(entry.name)
                    except OSError:  # gone meanwhile
                        continue
                    parents[int(entry.name)] = int(fields[1])
                    cpu[int(entry.name)] = int(fields[11]) + int(fields[12])
        except OSError:
            return None
        ours = {os.getpid()}
        grew = True
        while grew:
            found = {pid for pid, parent in parents.items() if parent in ours} - ours
            ours |= found
            grew = bool(found)
        hz = os.sysconf("SC_CLK_TCK")
        busy = ticks[0] + ticks[1] + ticks[2] + ticks[5] + ticks[6]
        return MachineTimes(busy / hz, ticks[7] / hz, sum(cpu[pid] for pid in ours) / hz)


async def closed_loop(
    send: Send,
    concurrency: int,
    indices: Sequence[int],
    cpu_clock: CpuClock | None = None,
    roles: Roles | None = None,
) -> Level:
    """``concurrency`` workers, each sending its next request when its last one is done."""
    pending = iter(indices)  # shared: one event loop, so no two workers take the same index
    samples: dict[int, Sample] = {}

    async def worker() -> None:
        for i in pending:
            samples[i] = await send(i)

    processes = roles() if roles is not None else {}
    switches_before = {role: context_switches(pids) for role, pids in processes.items()}
    cpu_before = cpu_clock() if cpu_clock is not None else {}
    machine_before = MachineTimes.now()
    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    level = Level(concurrency, time.perf_counter() - started, samples)
    if cpu_clock is not None:
        level.cpu = {name: t - cpu_before[name] for name, t in cpu_clock().items()}
    for role, pids in processes.items():
        (v0, i0), (v1, i1) = switches_before[role], context_switches(pids)
        level.switches[role] = (v1 - v0, i1 - i0)
    machine_after = MachineTimes.now()
    if machine_before is not None and machine_after is not None:
        capacity = level.wall * (os.cpu_count() or 1)
        others = (machine_after.busy - machine_before.busy) - (
            machine_after.ours - machine_before.ours
        )
        level.others = max(0.0, others) / capacity
        level.steal = (machine_after.steal - machine_before.steal) / capacity
    short = [i for i, s in samples.items() if len(s.token_ids) != MAX_TOKENS]
    if short:
        raise RuntimeError(f"requests {short} did not produce {MAX_TOKENS} tokens")
    return level


def level_indices(concurrency: int, requests: int) -> list[int]:
    """The prompt numbers of one level: the same for every contender, distinct across levels."""
    return list(range(concurrency * 100_000, concurrency * 100_000 + requests))


def requests_for(concurrency: int, per_level: int | None, loops: int = 6) -> int:
    # ``loops`` rounds of the closed loop (6: a level is not one batch starting and ending)
    return per_level if per_level is not None else max(4 * loops, loops * concurrency)


# ── contenders ──────────────────────────────────────────────────────────────────────────────


class InProcess:
    """vLLM's AsyncLLM in this process, with mmgate's engine arguments."""

    def __init__(self, settings: EngineSettings, model: str) -> None:
        self.settings = settings
        self.model = model
        self._engine: AsyncLLM | None = None
        self.tag = "a"

    @property
    def name(self) -> str:
        return "in-process"

    @property
    def engine(self) -> AsyncLLM:
        assert self._engine is not None, "not started"
        return self._engine

    async def start(self) -> float:
        """Start the engine; seconds it took."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind
        from vllm.v1.engine.async_llm import AsyncLLM

        args = EngineWorker(self.settings).engine_args(EnginePlan(self.model))
        started = time.perf_counter()
        self._engine = AsyncLLM.from_engine_args(args)
        elapsed = time.perf_counter() - started
        self.tokenizer = self._engine.get_tokenizer()
        self.params = SamplingParams(
            max_tokens=MAX_TOKENS,
            temperature=0.0,
            ignore_eos=True,
            output_kind=RequestOutputKind.DELTA,
        )
        return elapsed

    def render(self, text: str) -> list[int]:
        return chat_token_ids(self.tokenizer, text)

    async def send(self, i: int) -> Sample:
        from vllm.inputs import TokensPrompt

        started = time.perf_counter()
        ids = self.render(prompt_text(i, self.tag))
        rendered = time.perf_counter()
        first: float | None = None
        tokens: list[int] = []
        async for output in self.engine.generate(
            TokensPrompt(prompt_token_ids=ids), self.params, f"bench-{uuid.uuid4().hex}"
        ):
            new = output.outputs[0].token_ids
            if new and first is None:
                first = time.perf_counter()
            tokens.extend(new)
        assert first is not None, "no tokens"
        ended = time.perf_counter()
        return Sample(first - started, tuple(tokens), ended - started, (rendered - started) * 1000)

    def cpu_seconds(self) -> dict[str, float]:
        """This process: the load generator and AsyncLLM's front end (the engine core is not)."""
        return {"process": time.process_time()}

    def roles(self) -> dict[str, list[int]]:
        return {"client": [os.getpid()], "engine": descendants(os.getpid())}

    async def close(self) -> None:
        if self._engine is not None:
            engine, self._engine = self._engine, None
            engine.shutdown()


class Mmgate:
    """``mmgate serve`` in a child process with default settings, over loopback gRPC."""

    def __init__(self, model: str, env: dict[str, str] | None = None) -> None:
        self.model = model
        self.env = env or {}
        self.port = free_port()
        self.policy = "bypass"
        self.tag = "a"
        self.adapter = ""  # a LoRA adapter the requests name ("" : the base model)
        self._process: asyncio.subprocess.Process | None = None
        self._client: MmgateClient | None = None
        self._log: IO[bytes] | None = None

    @property
    def name(self) -> str:
        return f"mmgate ({self.policy})"

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def client(self) -> MmgateClient:
        assert self._client is not None, "not started"
        return self._client

    @property
    def pid(self) -> int:
        assert self._process is not None, "not started"
        return self._process.pid

    @property
    def log_path(self) -> str:
        return self._log.name if self._log is not None else ""

    def log_tail(self, lines: int = 40) -> str:
        text = Path(self.log_path).read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    async def start(self) -> float:
        """Start the server; seconds until its health says SERVING."""
        env = {**ENV, **os.environ}
        env.update(
            {
                "MMGATE_HOST": "127.0.0.1",
                "MMGATE_PORT": str(self.port),
                "MMGATE_ENGINE__MODEL": self.model,
                "MMGATE_LOG_LEVEL": "INFO",
                **self.env,
            }
        )
        self._log = tempfile.NamedTemporaryFile(  # noqa: SIM115 - kept open while it runs
            prefix="mmgate-bench-", suffix=".log", delete=False
        )
        started = time.perf_counter()
        self._process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "services.cli",
            "serve",
            cwd=ROOT,
            env=env,
            stdout=self._log,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
        self._client = MmgateClient(self.target, timeout=START_TIMEOUT)
        await self._wait_serving(self._process)
        return time.perf_counter() - started

    async def _wait_serving(self, process: asyncio.subprocess.Process) -> None:
        """Until health's Watch stream says SERVING, or the server exits (no polling)."""
        watch = asyncio.ensure_future(asyncio.to_thread(wait_serving, self.target, START_TIMEOUT))
        exited = asyncio.ensure_future(process.wait())
        done, _ = await asyncio.wait(
            {watch, exited}, timeout=START_TIMEOUT, return_when=asyncio.FIRST_COMPLETED
        )
        if watch in done and watch.exception() is None:
            exited.cancel()
            return
        exited.cancel()
        reason = (
            f"exited with {process.returncode}"
            if process.returncode is not None
            else f"not serving after {START_TIMEOUT:.0f} s"
            if not done
            else repr(watch.exception())
        )
        await self.close()
        # the health watch ends with the server's port (it has stopped) or at its deadline
        await asyncio.gather(watch, exited, return_exceptions=True)
        raise RuntimeError(f"mmgate serve {reason}:\n{self.log_tail()}")

    def request(self, i: int) -> GenerateRequest:
        """The i-th request: its own prompt, greedy, MAX_TOKENS exactly."""
        return build_request(
            prompt_text(i, self.tag),
            max_tokens=MAX_TOKENS,
            temperature=0.0,
            ignore_eos=True,
            cache_policy=self.policy,
            adapter=self.adapter,
        )

    async def send(self, i: int) -> Sample:
        started = time.perf_counter()
        request = self.request(i)
        first: float | None = None
        tokens: list[int] = []
        prompt_ms: float | None = None
        async for event in self.client.generate(request):
            if event.HasField("delta"):
                if first is None:
                    first = time.perf_counter()
                tokens.extend(event.delta.token_ids)
            else:
                for lookup in event.final.cache.lookups:
                    if lookup.stage == "prompt":
                        prompt_ms = lookup.wait_ms
        assert first is not None, "no tokens"
        ended = time.perf_counter()
        return Sample(
            first - started, tuple(tokens), ended - started, prompt_ms, request.ByteSize()
        )

    def cpu_seconds(self) -> dict[str, float]:
        """This process (the load generator and gRPC client) and the server's main process."""
        assert self._process is not None
        return {"client": time.process_time(), "server": process_cpu_seconds(self._process.pid)}

    def roles(self) -> dict[str, list[int]]:
        return {"client": [os.getpid()], "server": [self.pid], "engine": descendants(self.pid)}

    async def close(self) -> int | None:
        """SIGTERM, then wait for the server's own clean exit; its exit code."""
        if self._client is not None:
            client, self._client = self._client, None
            await client.close()
        process, self._process = self._process, None
        return await shut_down(process, self._log, STOP_TIMEOUT)


class VllmServe:
    """vLLM's OpenAI-compatible server with mmgate's engine arguments, over loopback HTTP."""

    name = "vllm serve"

    def __init__(self, settings: EngineSettings, model: str) -> None:
        self.server: OpenAIServer | VllmGrpcServer = OpenAIServer(settings, model)
        self.tag = "a"

    async def start(self) -> float:
        return await self.server.start(ENV)

    async def request(self, text: str) -> tuple[float, tuple[int, ...], int]:
        """One streamed request: seconds to the first token, the tokens, bytes sent."""
        assert isinstance(self.server, OpenAIServer)
        return await self.server.chat(text, max_tokens=MAX_TOKENS)

    async def send(self, i: int) -> Sample:
        started = time.perf_counter()
        ttft, tokens, sent = await self.request(prompt_text(i, self.tag))
        return Sample(ttft, tokens, time.perf_counter() - started, None, sent)

    def cpu_seconds(self) -> dict[str, float]:
        """This process (the client) and the server's main process (its front end)."""
        return {"client": time.process_time(), "server": process_cpu_seconds(self.server.pid)}

    def roles(self) -> dict[str, list[int]]:
        pid = self.server.pid
        return {"client": [os.getpid()], "server": [pid], "engine": descendants(pid)}

    async def close(self) -> int | None:
        return await self.server.close()


class VllmGrpc(VllmServe):
    """vLLM's own gRPC server with mmgate's engine arguments: gRPC streaming without mmgate."""

    name = "vllm grpc"

    def __init__(self, settings: EngineSettings, model: str) -> None:
        self.server = VllmGrpcServer(settings, model)
        self.tag = "a"

    async def request(self, text: str) -> tuple[float, tuple[int, ...], int]:
        assert isinstance(self.server, VllmGrpcServer)
        return await self.server.generate(text, max_tokens=MAX_TOKENS)


async def warm_up(send: Send, count: int, concurrency: int) -> float:
    """``count`` requests, ``concurrency`` at a time, not measured; seconds they took.

    At the highest level's concurrency: whatever grows with concurrency (thread pools, vLLM's
    pool of tokenizer copies) has grown before the measurements.
    """
    started = time.perf_counter()
    await closed_loop(send, max(1, min(concurrency, count)), range(-count, 0))
    return time.perf_counter() - started


class Contender(Protocol):
    async def send(self, i: int) -> Sample: ...

    def cpu_seconds(self) -> dict[str, float]: ...

    def roles(self) -> dict[str, list[int]]: ...


async def run_levels(
    contender: Contender, levels: Sequence[int], per_level: Count, label: str
) -> dict[int, Level]:
    results: dict[int, Level] = {}
    for c in levels:
        indices = level_indices(c, per_level(c))
        level = await closed_loop(
            contender.send, c, indices, contender.cpu_seconds, contender.roles
        )
        results[c] = level
        engine = level.switches_per_request().get("engine")
        if engine is not None:
            print(
                f"  {'':<21} c={c:<3} engine context switches/request: "
                f"{engine['involuntary']:.0f} involuntary, {engine['voluntary']:.0f} voluntary",
                flush=True,
            )
        print(
            f"  {label:<21} c={c:<3} {len(level.samples):>3} requests  {level.wall:6.1f} s  "
            f"{level.throughput:7.1f} tok/s  TTFT p50 {level.ttft_ms(0.5):7.1f} ms  "
            f"p99 {level.ttft_ms(0.99):7.1f} ms  prompt stage p50/p99 {level.prompt_ms(0.5):.2f}"
            f" / {level.prompt_ms(0.99):.2f} ms  CPU/request "
            f"{sum(level.cpu_ms_per_request().values()):.1f} ms "
            f"(other load {level.others:.0%}, steal {level.steal:.0%})",
            flush=True,
        )
    return results


# ── the comparison ──────────────────────────────────────────────────────────────────────────


@dataclass
class Run:
    name: str
    tag: str  # the prompts' tag: runs with the same tag served the same prompts
    start_s: float
    warmup_s: float
    levels: dict[int, Level]
    # resident memory of the serving processes (the server or this process, with the engine
    # core) after the levels
    rss_bytes: int = 0


async def measure_in_process(
    settings: EngineSettings, model: str, levels: Sequence[int], per_level: Count, warm: int
) -> Run:
    contender = InProcess(settings, model)
    label = f"in-process{'' if settings.enforce_eager else ' (compiled)'}"
    try:
        start_s = await contender.start()
        print(f"  {label:<21} engine started in {start_s:.1f} s", flush=True)
        warmup_s = await warm_up(contender.send, warm, max(levels))
        results = await run_levels(contender, levels, per_level, label)
        rss = tree_rss_bytes(os.getpid())
    finally:
        await contender.close()
    return Run(label, contender.tag, start_s, warmup_s, results, rss)


async def measure_vllm_serve(
    settings: EngineSettings,
    model: str,
    levels: Sequence[int],
    per_level: Count,
    warm: int,
    kind: type[VllmServe] = VllmServe,
) -> Run:
    """vLLM's own server (``kind``: the OpenAI one, or its gRPC one) on a fresh engine."""
    contender = kind(settings, model)
    try:
        start_s = await contender.start()
        print(f"  {contender.name:<21} healthy in {start_s:.1f} s", flush=True)
        warmup_s = await warm_up(contender.send, warm, max(levels))
        results = await run_levels(contender, levels, per_level, contender.name)
        rss = tree_rss_bytes(contender.server.pid)
    finally:
        code = await contender.close()
    print(f"  {contender.name} stopped, exit code {code}", flush=True)
    return Run(contender.name, contender.tag, start_s, warmup_s, results, rss)


async def measure_mmgate(
    model: str,
    policies: Sequence[str],
    levels: Sequence[int],
    per_level: Count,
    warm: int,
    stream_interval: int = 1,
) -> list[Run]:
    contender = Mmgate(model, {"MMGATE_ENGINE__STREAM_INTERVAL": str(stream_interval)})
    runs: list[Run] = []
    try:
        start_s = await contender.start()
        print(f"  mmgate serving in {start_s:.1f} s (log: {contender.log_path})", flush=True)
        for n, policy in enumerate(policies):
            contender.policy = policy
            # a second policy gets its own prompts: its engine has seen the first one's
            contender.tag = "a" if n == 0 else "b"
            warmup_s = await warm_up(contender.send, warm, max(levels))
            results = await run_levels(contender, levels, per_level, contender.name)
            rss = tree_rss_bytes(contender.pid)
            runs.append(Run(contender.name, contender.tag, start_s, warmup_s, results, rss))
    finally:
        code = await contender.close()
    print(f"  mmgate stopped on SIGTERM, exit code {code}", flush=True)
    return runs


def same_outputs(a: Run, b: Run) -> tuple[int, int]:
    """Requests of the same prompt that gave the same tokens (greedy, same seed)."""
    same = total = 0
    if a.tag != b.tag:
        return 0, 0
    for c, level in a.levels.items():
        for i, sample in level.samples.items():
            other = b.levels[c].samples.get(i)
            if other is not None:
                total += 1
                same += other.token_ids == sample.token_ids
    return same, total


def report_disturbed(runs: Sequence[Run]) -> None:
    disturbed = [
        f"{run.name} c={c} ({level.others:.0%} other load, {level.steal:.0%} steal)"
        for run in runs
        for c, level in run.levels.items()
        if level.others + level.steal > DISTURBED
    ]
    if disturbed:
        print(f"disturbed (over {DISTURBED:.0%} of the machine's CPU went to other processes or")
        print("the hypervisor; rerun before trusting these): " + "; ".join(disturbed))


def report(base: Run, others: Sequence[Run], levels: Sequence[int]) -> None:
    """Per level: each contender's figures, then each mmgate row against in-process."""
    print()
    print(
        f"{'level':<7}{'contender':<18}{'requests':>9}{'tok/s':>10}"
        f"{'TTFT p50 ms':>20}{'TTFT p99 ms':>20}"
    )
    for c in levels:
        b = base.levels[c]
        for n, run in enumerate([base, *others]):
            level = run.levels[c]
            print(
                f"{f'c={c}' if n == 0 else '':<7}{run.name:<18}{len(level.samples):>9}"
                f"{level.throughput:>10.1f}{level.ttft_ms(0.5):>20.1f}{level.ttft_ms(0.99):>20.1f}"
            )
        for run in others:
            m = run.levels[c]
            ttft = [
                f"{m.ttft_ms(q) - b.ttft_ms(q):+.1f} ms ({m.ttft_ms(q) / b.ttft_ms(q):.2f}x)"
                for q in (0.5, 0.99)
            ]
            label = f"{run.name.removeprefix('mmgate ')} / in-proc"
            print(
                f"{'':<7}{label:<18}{'':>9}{f'{m.throughput / b.throughput:.3f}x':>10}"
                f"{ttft[0]:>20}{ttft[1]:>20}"
            )
    print()
    print("where the time goes, per level:")
    print("  prompt stage ms p50/p99: chat template + tokenize (in-process: inline, before")
    print("    generate; mmgate: as its server reports it, in a thread, through the cache actor")
    print("    for 'prompt')")
    cores = os.cpu_count()
    print(f"  CPU ms per request outside the engine core ({cores} cores: the engine's loss):")
    print("    in-process: this process; mmgate: this process (client) + the server's")
    for c in levels:
        for n, run in enumerate([base, *others]):
            level = run.levels[c]
            cpu = " + ".join(f"{ms:.1f} {name}" for name, ms in level.cpu_ms_per_request().items())
            print(
                f"{f'c={c}' if n == 0 else '':<7}{run.name:<18}"
                f"  prompt stage {level.prompt_ms(0.5):5.2f} / {level.prompt_ms(0.99):6.2f} ms"
                f"    CPU {sum(level.cpu_ms_per_request().values()):6.1f} ms ({cpu})"
            )
    print()
    report_disturbed([base, *others])
    for run in others:
        same, total = same_outputs(base, run)
        if total:
            print(f"{run.name}: {same}/{total} requests gave the same tokens as in-process")
    starts = {r.name: r.start_s for r in (base, *others)}
    print(
        "engine start: "
        + ", ".join(f"{name} {seconds:.1f} s" for name, seconds in starts.items())
        + " (mmgate: from spawning the process to health SERVING)"
    )
    print()
    for run in others:
        worst = min(levels, key=lambda c: run.levels[c].throughput / base.levels[c].throughput)
        ratio = run.levels[worst].throughput / base.levels[worst].throughput
        goal = f"{run.name}: >= 0.95x in-process throughput at every level"
        verdict = "met" if ratio >= 0.95 else "NOT MET"
        print(f"goal: {goal:<62} {ratio:6.3f}x at c={worst:<3} {verdict}")
        if 1 in run.levels:
            delta = run.levels[1].ttft_ms(0.5) - base.levels[1].ttft_ms(0.5)
            goal = f"{run.name}: TTFT p50 at c=1 within 3 ms of in-process"
            verdict = "met" if delta <= 3 else "NOT MET"
            print(f"goal: {goal:<62} {delta:+6.2f} ms       {verdict}")


def report_compilation(eager: Run, compiled: Run, levels: Sequence[int]) -> None:
    print()
    print(f"{'in-process':<28}{'eager':>12}{'compiled':>12}{'compiled/eager':>16}")
    rows: list[tuple[str, float, float]] = [
        ("engine start (s)", eager.start_s, compiled.start_s),
        ("warm-up requests (s)", eager.warmup_s, compiled.warmup_s),
    ]
    for c in levels:
        e, k = eager.levels[c], compiled.levels[c]
        rows.append((f"c={c} tok/s", e.throughput, k.throughput))
        rows.append((f"c={c} TTFT p50 (ms)", e.ttft_ms(0.5), k.ttft_ms(0.5)))
    for name, a, b in rows:
        print(f"{name:<28}{a:>12.1f}{b:>12.1f}{b / a:>15.2f}x")
    print()
    report_disturbed([eager, compiled])
    same, total = same_outputs(eager, compiled)
    print(f"compiled: {same}/{total} requests gave the same tokens as eager")


async def main(args: argparse.Namespace) -> None:
    for name, value in ENV.items():
        os.environ.setdefault(name, value)
    if args.dtype is not None:
        os.environ["MMGATE_ENGINE__DTYPE"] = args.dtype  # every contender, the server's too

    def count(concurrency: int) -> int:
        return requests_for(concurrency, args.requests_per_level, args.loops)

    settings = Settings()
    model = resolve_model(settings)
    started = time.perf_counter()
    if args.compare_compilation:
        levels = args.levels or [1, 16]
        print(f"model {model}; in-process, eager then compiled; levels {levels}", flush=True)
        eager = await measure_in_process(
            settings.engine.model_copy(update={"enforce_eager": True}),
            model,
            levels,
            count,
            args.warmup,
        )
        compiled = await measure_in_process(
            settings.engine.model_copy(update={"enforce_eager": False}),
            model,
            levels,
            count,
            args.warmup,
        )
        report_compilation(eager, compiled, levels)
    else:
        levels = args.levels or list(LEVELS)
        policies = ["bypass", "prompt"] if args.cache_policy == "both" else [args.cache_policy]
        e = settings.engine
        dtype = EngineWorker(e).dtype
        print(
            f"model {model}; engine: dtype {dtype}, max_model_len {e.max_model_len}, "
            f"max_num_seqs {e.max_num_seqs}, kv_cache_memory_bytes {e.kv_cache_memory_bytes}, "
            f"enforce_eager {e.enforce_eager}; levels {levels}; {MAX_TOKENS} tokens per request; "
            f"contenders {args.contenders}, {args.rounds} round(s), alternated",
            flush=True,
        )

        def measure(name: str, interval: int) -> Awaitable[list[Run]]:
            if name == "mmgate":
                return measure_mmgate(model, policies, levels, count, args.warmup, interval)
            engine = e.model_copy(update={"stream_interval": interval})
            if name == "in-process":
                return _one(measure_in_process(engine, model, levels, count, args.warmup))
            kind = VllmGrpc if name == "vllm-grpc" else VllmServe
            return _one(measure_vllm_serve(engine, model, levels, count, args.warmup, kind))

        # every contender at every stream interval; a name carries its interval when above 1
        entries = [(name, k) for name in args.contenders for k in args.stream_intervals]
        rounds: list[list[Run]] = []
        for n in range(args.rounds):
            # each round starts with the next contender: none always has the coolest machine
            order = entries[n % len(entries) :] + entries[: n % len(entries)]
            print(f"round {n + 1}: {', '.join(f'{c} /{k}' for c, k in order)}", flush=True)
            runs = [
                dataclasses.replace(run, name=with_interval(run.name, k))
                for name, k in order
                for run in await measure(name, k)
            ]
            base = next((r for r in runs if r.name == "in-process"), None)
            if base is not None:
                report(base, [r for r in runs if r is not base], levels)
            rounds.append(runs)
        summarize(rounds, levels)
        if args.json is not None:
            write_json(
                args.json,
                rounds,
                levels,
                dtype=dtype,
                model=model,
                stream_intervals=" ".join(map(str, args.stream_intervals)),
            )
    print(f"\nwhole run: {time.perf_counter() - started:.0f} s")


async def _one(run: Awaitable[Run]) -> list[Run]:
    return [await run]


def _by_name(runs: Sequence[Run]) -> dict[str, Run]:
    return {run.name: run for run in runs}


def with_interval(name: str, interval: int) -> str:
    """A contender's name at a stream interval: "mmgate (prompt) /4"; at 1, the name alone."""
    return name if interval == 1 else f"{name} /{interval}"


def interval_of(name: str) -> int:
    head, _, tail = name.rpartition(" /")
    return int(tail) if head and tail.isdigit() else 1


def summarize(rounds: Sequence[Sequence[Run]], levels: Sequence[int]) -> None:
    """Across rounds, lowest / median / highest: each mmgate row against each other contender at
    the same stream interval, and against mmgate at interval 1 (the interval's before and after)."""
    names = [run.name for run in rounds[0]]
    mine = [n for n in names if n.startswith("mmgate")]
    theirs = [n for n in names if not n.startswith("mmgate")]
    print(f"\nacross {len(rounds)} round(s): ratio lowest / median / highest")
    for m in mine:
        k = interval_of(m)
        base = [n for n in mine if k > 1 and with_interval(n, k) == m]  # the same at 1
        for t in [n for n in theirs if interval_of(n) == k] + base:
            for c in levels:
                pairs = [(_by_name(r)[m].levels[c], _by_name(r)[t].levels[c]) for r in rounds]
                tok = sorted(a.throughput / b.throughput for a, b in pairs)
                p99 = sorted(a.ttft_ms(0.99) / b.ttft_ms(0.99) for a, b in pairs)
                print(
                    f"  {m} / {t:<12} c={c:<3} tok/s {tok[0]:.3f} / {tok[len(tok) // 2]:.3f} /"
                    f" {tok[-1]:.3f}x   TTFT p99 {p99[0]:.2f} / {p99[len(p99) // 2]:.2f} /"
                    f" {p99[-1]:.2f}x"
                )
    for name in names:
        starts = sorted(_by_name(r)[name].start_s for r in rounds)
        rss = sorted(_by_name(r)[name].rss_bytes / 2**20 for r in rounds)
        print(
            f"  {name:<18} start {starts[0]:.1f}-{starts[-1]:.1f} s, "
            f"RSS after the levels {rss[0]:.0f}-{rss[-1]:.0f} MiB"
        )


def write_json(
    path: Path, rounds: Sequence[Sequence[Run]], levels: Sequence[int], **about: str
) -> None:
    """Every run's figures per level, for docs/benchmarks.md and bench/plots.py."""
    out = {
        "about": {**about, "levels": list(levels), "cpus": os.cpu_count(), "date": time.ctime()},
        "rounds": [
            [
                {
                    "name": run.name,
                    "start_s": run.start_s,
                    "rss_bytes": run.rss_bytes,
                    "levels": {
                        str(c): {
                            "requests": len(level.samples),
                            "tok_s": level.throughput,
                            "ttft_p50_ms": level.ttft_ms(0.5),
                            "ttft_p99_ms": level.ttft_ms(0.99),
                            "e2e_p50_ms": level.e2e_ms(0.5),
                            "e2e_p99_ms": level.e2e_ms(0.99),
                            "prompt_p50_ms": level.prompt_ms(0.5),
                            "prompt_p99_ms": level.prompt_ms(0.99),
                            "cpu_ms_per_request": level.cpu_ms_per_request(),
                            "switches_per_request": level.switches_per_request(),
                            "other_load": level.others,
                        }
                        for c, level in run.levels.items()
                    },
                }
                for run in runs
            ]
            for runs in rounds
        ],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1))
    print(f"figures written to {path}")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--requests-per-level",
        type=int,
        default=None,
        help="requests measured at each level (default: max(24, 6 x concurrency))",
    )
    parser.add_argument(
        "--levels", type=int, nargs="+", default=None, help="concurrency levels (default 1 4 16 64)"
    )
    parser.add_argument(
        "--warmup",
        type=int,
        default=16,
        help="unmeasured requests first, at the highest level's concurrency (default 16)",
    )
    parser.add_argument(
        "--cache-policy",
        choices=["bypass", "prompt", "both"],
        default="both",
        help="mmgate's cache policy: bypass (no cache actor), prompt (mmgate's default), both",
    )
    parser.add_argument(
        "--contenders",
        nargs="+",
        choices=["in-process", "mmgate", "vllm-serve", "vllm-grpc"],
        default=["in-process", "mmgate", "vllm-serve", "vllm-grpc"],
        help="who is measured, in this order in the first round",
    )
    parser.add_argument(
        "--rounds", type=int, default=1, help="rounds, each starting with the next contender"
    )
    parser.add_argument("--json", type=Path, default=None, help="write every figure here")
    parser.add_argument(
        "--loops",
        type=int,
        default=6,
        help="closed-loop rounds per level: max(4 x loops, loops x concurrency) requests",
    )
    parser.add_argument("--dtype", default=None, help="the engines' dtype (default: mmgate's)")
    parser.add_argument(
        "--stream-intervals",
        type=int,
        nargs="+",
        default=[1],
        help="vLLM's stream_interval (tokens per streamed message) for every engine: each"
        " contender runs at each, its name ending in /N above 1 (default: 1)",
    )
    parser.add_argument(
        "--compare-compilation",
        action="store_true",
        help="in-process only: enforce_eager=True vs vLLM's compilation (levels 1 16)",
    )
    return parser.parse_args(argv)


def rounds_main(
    description: str,
    run: Callable[[argparse.Namespace], Coroutine[Any, Any, dict[str, Any]]],
    argv: Sequence[str] | None = None,
) -> int:
    """The command line of a benchmark of alternated rounds at concurrency levels: --rounds,
    --levels, --requests, --json (the rows and ratios ``run`` returns)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--requests", type=int, help="per level (default: 3 loops of it)")
    parser.add_argument("--json", type=Path, help="write the rows and ratios here")
    args = parser.parse_args(argv)
    for name, value in ENV.items():
        os.environ.setdefault(name, value)
    found = asyncio.run(run(args))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(found, indent=2))
    return 0


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
