"""Debian's HAProxy, started in the foreground (``-db``) with a configuration of its own and
stopped at the end, as a per-connection TCP proxy (``TcpProxy``, ``mode tcp``) in two roles:

- the mesh sidecar: connections to mmgate leave from ``source`` (Istio's REDIRECT mode sends them
  from 127.0.0.6), so the server sees the sidecar's address, not the caller's;
- kube-proxy: a Kubernetes Service balancing connections (not requests) over the replicas,
  round-robin, with a health check so that a replica that is not listening yet gets none;

and as the mesh's L7 balancing of gRPC calls (``GrpcHashProxy``): a consistent hash of the
affinity header, with bounded loads or without.
"""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path
from typing import Self

from tests.support import free_port, installed


class _HAProxy:
    """One HAProxy process over ``backends`` (ports on 127.0.0.1), its configuration the
    subclass's ``_config``; started once it listens, stopped at the end."""

    def __init__(self, directory: Path, backends: list[int]) -> None:
        self.directory = directory
        self.backends = list(backends)
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _config(self) -> str:
        raise NotImplementedError

    def start(self, timeout: float = 20.0) -> Self:
        self.directory.mkdir(parents=True, exist_ok=True)
        config = self.directory / "haproxy.cfg"
        config.write_text(self._config())
        check = subprocess.run(
            [installed("haproxy"), "-c", "-f", str(config)], capture_output=True, timeout=30
        )
        assert check.returncode == 0, check.stdout.decode() + check.stderr.decode()
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


class TcpProxy(_HAProxy):
    def __init__(self, directory: Path, backends: list[int], *, source: str | None = None) -> None:
        super().__init__(directory, backends)
        self.source = source

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


class GrpcHashProxy(_HAProxy):
    """HAProxy as an L7 gRPC proxy hashing ``x-mmgate-affinity`` onto a consistent ring of the
    replicas (HTTP/2 both ways, each call routed on its own), as the mesh's sidecars do; with
    ``balance_factor`` (percent): consistent hashing with bounded loads (``hash-balance-factor``),
    a replica taking a key's call only while its calls in progress stay within the factor of the
    average, else the next replica on the ring. Its per-replica counts come from the stats socket.
    """

    def __init__(
        self, directory: Path, backends: list[int], *, balance_factor: int | None = None
    ) -> None:
        super().__init__(directory, backends)
        self.balance_factor = balance_factor

    @property
    def socket_path(self) -> Path:
        return self.directory / "stats.sock"

    def _config(self) -> str:
        servers = "\n".join(
            f"    server r{i} 127.0.0.1:{port} proto h2" for i, port in enumerate(self.backends)
        )
        factor = f"    hash-balance-factor {self.balance_factor}\n" if self.balance_factor else ""
        return (
            f"global\n    maxconn 1024\n    stats socket {self.socket_path} mode 600 level admin\n"
            "defaults\n    mode http\n    timeout connect 5s\n"
            "    timeout client 10m\n    timeout server 10m\n"
            f"frontend grpc\n    bind 127.0.0.1:{self.port} proto h2\n"
            "    default_backend replicas\n"
            "backend replicas\n    balance hdr(x-mmgate-affinity)\n    hash-type consistent\n"
            f"{factor}{servers}\n"
        )

    def server_stats(self) -> dict[int, dict[str, int]]:
        """Each replica's calls in all (``stot``), most at once (``smax``) and their average
        length in ms over its last 1,024 (``ttime``), by port."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as stats:
            stats.connect(str(self.socket_path))
            stats.sendall(b"show stat\n")
            raw = b""
            while chunk := stats.recv(65536):
                raw += chunk
        lines = raw.decode().splitlines()
        header = lines[0].lstrip("# ").split(",")
        by_port = {f"r{i}": port for i, port in enumerate(self.backends)}
        found = {}
        for line in lines[1:]:
            row = dict(zip(header, line.split(","), strict=False))
            if row.get("pxname") == "replicas" and row.get("svname") in by_port:
                found[by_port[row["svname"]]] = {
                    key: int(row[key] or 0) for key in ("stot", "smax", "ttime")
                }
        return found
