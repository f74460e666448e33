"""Debian's HAProxy as a per-connection TCP proxy (``mode tcp``), in two roles:

- the mesh sidecar: connections to mmgate leave from ``source`` (Istio's REDIRECT mode sends them
  from 127.0.0.6), so the server sees the sidecar's address, not the caller's;
- kube-proxy: a Kubernetes Service balancing connections (not requests) over the replicas,
  round-robin, with a health check so that a replica that is not listening yet gets none.

Started in the foreground (``-db``) with a configuration of its own, stopped at the end.
"""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

from tests.support import free_port, installed


class TcpProxy:
    def __init__(self, directory: Path, backends: list[int], *, source: str | None = None) -> None:
        self.directory = directory
        self.backends = list(backends)
        self.source = source
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _config(self) -> str:
        source = f" source {self.source}" if self.source else ""
        servers = "\n".join(
            f"    server r{i} 127.0.0.1:{port} check inter 300ms fall 1 rise 1{source}"
            for i, port in enumerate(self.backends)
        )
        return (
            "global\n    maxconn 256\n"
            # a connection to a replica that is not listening (yet) goes to another
            "defaults\n    mode tcp\n    retries 3\n    option redispatch 1\n"
            "    timeout connect 5s\n"
            "    timeout client 10m\n    timeout server 10m\n"
            f"frontend service\n    bind 127.0.0.1:{self.port}\n    default_backend replicas\n"
            f"backend replicas\n    balance roundrobin\n{servers}\n"
        )

    def start(self, timeout: float = 20.0) -> TcpProxy:
        self.directory.mkdir(parents=True, exist_ok=True)
        config = self.directory / "haproxy.cfg"
        config.write_text(self._config())
        with (self.directory / "haproxy.log").open("wb") as log:
            self.process = subprocess.Popen(
                [installed("haproxy"), "-db", "-f", str(config)],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout
        while True:
            assert self.process.poll() is None, f"haproxy exited:\n{self.log()}"
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return self
            except OSError:
                assert time.monotonic() < deadline, f"haproxy never listened:\n{self.log()}"
                time.sleep(0.05)

    def log(self) -> str:
        path = self.directory / "haproxy.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
