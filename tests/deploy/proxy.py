"""Debian's nginx in front of real mmgate replicas (deploy/proxy/nginx.conf), as the mesh is in
a cluster: started in the foreground with a prefix of its own, reloaded with a replica marked
down (what Kubernetes' endpoint removal does), stopped at the end."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import psutil

from tests.support import ROOT, eventually, free_port, installed

CONFIG = ROOT / "deploy" / "proxy" / "nginx.conf"


class Nginx:
    def __init__(self, directory: Path, backends: list[int]) -> None:
        self.directory = directory
        self.backends = list(backends)
        self.down: set[int] = set()
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _write(self) -> Path:
        servers = "\n".join(
            f"        server 127.0.0.1:{port}{' down' if port in self.down else ''};"
            for port in self.backends
        )
        text = (
            CONFIG.read_text()
            .replace("@PREFIX@", str(self.directory))
            .replace("@PORT@", str(self.port))
            .replace("@SERVERS@", servers)
        )
        path = self.directory / "nginx.conf"
        path.write_text(text)
        return path

    def start(self) -> Nginx:
        self.directory.mkdir(parents=True, exist_ok=True)
        config = self._write()
        check = subprocess.run(
            [installed("nginx"), "-t", "-p", str(self.directory), "-c", str(config)],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert check.returncode == 0, check.stderr
        self.process = subprocess.Popen(
            [installed("nginx"), "-p", str(self.directory), "-c", str(config)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        return self

    def workers(self) -> set[int]:
        assert self.process is not None
        try:
            return {c.pid for c in psutil.Process(self.process.pid).children()}
        except psutil.NoSuchProcess:
            return set()

    def reload(self, *, down: set[int]) -> set[int]:
        """Apply a new pool; returns the old workers (they finish their calls, then exit)."""
        assert self.process is not None
        self.down = set(down)
        self._write()
        old = self.workers()
        self.process.send_signal(signal.SIGHUP)
        return old

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGQUIT)  # graceful
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)

    def log(self) -> str:
        path = self.directory / "error.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""


async def wait_reloaded(proxy: Nginx, old: set[int], timeout: float = 60.0) -> float:
    """Until new workers run the new pool and the old ones have finished their calls; the
    seconds it took."""

    async def reloaded() -> bool:
        current = proxy.workers()
        return bool(current) and not (current & old)

    return await eventually(reloaded, timeout)
