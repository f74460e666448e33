"""Real redis-server processes for the tests: one server (with a password, an ACL user or TLS) or
a 3-master Cluster, each on free ports, started and stopped by the test, never the machine's own.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.support import free_port

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"
REDIS_CLI = shutil.which("redis-cli") or "/usr/bin/redis-cli"


@dataclass
class RedisProcess:
    port: int
    directory: Path
    args: list[str]
    process: subprocess.Popen[bytes] | None = None
    password: str | None = None
    tls: Path | None = None  # the directory holding ca.crt when the server speaks TLS only
    cluster_ports: list[int] = field(default_factory=list)

    @property
    def url(self) -> str:
        scheme = "rediss" if self.tls is not None else "redis"
        auth = f":{self.password}@" if self.password else ""
        return f"{scheme}://{auth}127.0.0.1:{self.port}/0"

    def start(self) -> RedisProcess:
        with (self.directory / f"redis-{self.port}.log").open("ab") as log:
            self.process = subprocess.Popen(
                [REDIS_SERVER, *self.args], cwd=self.directory, stdout=log, stderr=subprocess.STDOUT
            )
        self.wait_ready()
        return self

    def cli(self, *command: str, check: bool = True) -> str:
        args = [REDIS_CLI, "-p", str(self.port)]
        if self.tls is not None:
            args[1:3] = ["--tls", "--cacert", str(self.tls / "ca.crt"), "-p", str(self.port)]
        if self.password:
            args += ["-a", self.password, "--no-auth-warning"]
        done = subprocess.run(
            [*args, *command], capture_output=True, text=True, timeout=30, check=False
        )
        if check and done.returncode != 0:
            raise RuntimeError(f"redis-cli {command}: {done.stdout}{done.stderr}")
        return done.stdout.strip()

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"redis-server on {self.port} exited")
            if self.cli("PING", check=False).endswith("PONG"):
                return
            time.sleep(0.05)
        raise TimeoutError(f"redis-server on {self.port} did not answer")

    def kill(self) -> None:
        """SIGKILL, as an out-of-memory kill or a node loss does."""
        assert self.process is not None
        self.process.kill()
        self.process.wait(timeout=30)

    def pause(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGCONT)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGCONT)
            self.process.terminate()
            self.process.wait(timeout=30)


def redis_server(
    directory: Path,
    *,
    password: str | None = None,
    acl: str | None = None,
    extra: list[str] | None = None,
) -> RedisProcess:
    """One server without persistence; ``acl`` is a line of ACL rules for an extra user,
    ``extra`` more redis-server arguments."""
    port = free_port()
    args = ["--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    args += extra or []
    if password:
        args += ["--requirepass", password]
    if acl:
        acl_file = directory / f"users-{port}.acl"
        acl_file.write_text(f"user default on nopass ~* &* +@all\nuser {acl}\n")
        args += ["--aclfile", str(acl_file)]
    return RedisProcess(port, directory, args, password=password).start()


def tls_redis_server(directory: Path) -> RedisProcess:
    """A server that speaks TLS only, with a self-signed CA and a certificate for 127.0.0.1."""
    certs = directory / "tls"
    certs.mkdir(exist_ok=True)
    _certificates(certs)
    port = free_port()
    args = [
        "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1", "--save", "",
        "--appendonly", "no", "--tls-cert-file", str(certs / "server.crt"),
        "--tls-key-file", str(certs / "server.key"), "--tls-ca-cert-file", str(certs / "ca.crt"),
        "--tls-auth-clients", "no",
    ]  # fmt: skip
    return RedisProcess(port, directory, args, tls=certs).start()


def redis_cluster(directory: Path) -> list[RedisProcess]:
    """Three masters, no replicas, joined with redis-cli --cluster create."""
    nodes = []
    for _ in range(3):
        port = _cluster_port()
        args = [
            "--port", str(port), "--bind", "127.0.0.1", "--cluster-enabled", "yes",
            "--cluster-config-file", str(directory / f"nodes-{port}.conf"), "--save", "",
            "--appendonly", "no",
        ]  # fmt: skip
        nodes.append(RedisProcess(port, directory, args).start())
    addresses = [f"127.0.0.1:{node.port}" for node in nodes]
    nodes[0].cli("--cluster", "create", *addresses, "--cluster-replicas", "0", "--cluster-yes")
    deadline = time.monotonic() + 30
    while "cluster_state:ok" not in nodes[0].cli("CLUSTER", "INFO"):
        if time.monotonic() > deadline:
            raise TimeoutError("the cluster did not reach state ok")
        time.sleep(0.1)
    return nodes


def _cluster_port() -> int:
    """A free port whose cluster bus port (10,000 above it) is free too."""
    import random
    import socket

    while True:
        port = random.randint(20_000, 55_000)
        try:
            for candidate in (port, port + 10_000):
                with socket.socket() as probe:
                    probe.bind(("127.0.0.1", candidate))
        except OSError:
            continue
        return port


def _certificates(directory: Path) -> None:
    """A CA and a server certificate for 127.0.0.1, with the cryptography package."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    def name(common: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])

    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(name("mmgate test CA"))
        .issuer_name(name("mmgate test CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    import ipaddress

    cert = (
        x509.CertificateBuilder()
        .subject_name(name("127.0.0.1"))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    (directory / "ca.crt").write_bytes(ca.public_bytes(pem))
    (directory / "server.crt").write_bytes(cert.public_bytes(pem))
    (directory / "server.key").write_bytes(
        key.private_bytes(
            pem, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption()
        )
    )


__all__ = ["RedisProcess", "redis_cluster", "redis_server", "tls_redis_server"]
