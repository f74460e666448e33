"""The core's edge processes: started with the server, watched, restarted, stopped last.

    Edges.start(): a private directory for the two Unix sockets (the core's own server, and
    the Relay service) ─▶ the public port reserved (SO_REUSEPORT; 0 in the settings: a free
    one) ─▶ N × ``python -m services.api.relay.edge`` ─▶ each one's Relay stream connected
    Edges.stop(): after the core's drain, SIGTERM; their streams end; a straggler is killed

An edge that dies is started again (its callers' streams failed UNAVAILABLE; new calls reach
the other edges meanwhile, the kernel balancing connections among the port's listeners).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import socket
import sys
import tempfile
from pathlib import Path
from typing import final

from ...config import Settings
from .core import RelayServicer

log = logging.getLogger("mmgate.edges")

START_SECONDS = 60.0  # an edge's interpreter, imports and Relay stream (about a second)


def reserve_port(host: str, port: int) -> socket.socket:
    """A socket bound to the public port with SO_REUSEPORT, not listening: the port stays the
    replica's (0: the kernel's choice) until the edges listen on it too."""
    family, kind, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    reserved = socket.socket(family, kind)
    reserved.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    reserved.bind(address)
    return reserved


@final
class Edges:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.directory = Path(tempfile.mkdtemp(prefix="mmgate-core-"))  # 0700: this user only
        self.core_socket = str(self.directory / "core.sock")
        self.relay_socket = str(self.directory / "relay.sock")
        self._reserved = reserve_port(settings.host, settings.port)
        self.port: int = self._reserved.getsockname()[1]
        self._processes: list[asyncio.subprocess.Process | None] = [None] * settings.edges
        self._watching: list[asyncio.Task[None]] = []
        self._stopping = False

    def _given(self) -> bytes:
        settings = self.settings.model_dump(
            mode="json",
            include={
                "host",
                "connections",
                "max_message_bytes",
                "log_level",
                "log_format",
            },
        )
        settings["port"] = self.port
        auth = self.settings.auth
        settings["auth"] = {  # the port's certificate: auth itself is the core's
            "tls_cert_file": auth.tls_cert_file and str(auth.tls_cert_file),
            "tls_key_file": auth.tls_key_file and str(auth.tls_key_file),
        }
        given = {"settings": settings, "relay": self.relay_socket, "core": self.core_socket}
        return json.dumps(given).encode()

    async def _spawn(self, index: int) -> asyncio.subprocess.Process:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "services.api.relay.edge",
            stdin=asyncio.subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        )
        assert process.stdin is not None
        process.stdin.write(self._given())
        await process.stdin.drain()
        process.stdin.close()
        self._processes[index] = process
        return process

    async def start(self, relay: RelayServicer) -> None:
        """Every edge started and its Relay stream connected, or an error."""
        for index in range(self.settings.edges):
            await self._spawn(index)
        try:
            async with asyncio.timeout(START_SECONDS), relay.connected:
                await relay.connected.wait_for(lambda: relay.edges >= self.settings.edges)
        except TimeoutError:
            raise RuntimeError(f"the edges did not connect within {START_SECONDS:g} s") from None
        finally:
            self._reserved.close()  # the edges hold the port now
        self._watching = [
            asyncio.ensure_future(self._watch(index)) for index in range(self.settings.edges)
        ]
        log.info("%d edge processes serve port %d", self.settings.edges, self.port)

    async def _watch(self, index: int) -> None:
        while not self._stopping:
            process = self._processes[index]
            assert process is not None
            code = await process.wait()
            if self._stopping:
                return
            log.error(
                "edge %d (pid %d) exited with %d: starting it again", index, process.pid, code
            )
            await self._spawn(index)

    async def stop(self, grace: float) -> None:
        """SIGTERM to every edge (its calls in flight have ``grace`` to end), then a kill."""
        self._stopping = True
        for watching in self._watching:
            watching.cancel()
        running = [p for p in self._processes if p is not None and p.returncode is None]
        for process in running:
            process.terminate()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(grace + 5.0):
                await asyncio.gather(*(p.wait() for p in running))
        for process in running:
            if process.returncode is None:
                process.kill()
                await process.wait()
        self._reserved.close()
        shutil.rmtree(self.directory, ignore_errors=True)

    def pids(self) -> list[int]:
        return [p.pid for p in self._processes if p is not None and p.returncode is None]


__all__ = ["Edges", "reserve_port"]
