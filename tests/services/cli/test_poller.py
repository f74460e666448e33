"""``mmgate serve`` runs gRPC's classic poller unless GRPC_EXPERIMENTS says otherwise, and it can
only choose because nothing before ``main`` imports grpc (grpc reads the variable once, when it
initialises). Each import check runs in a fresh interpreter of this venv."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from services.cli.poller import CLASSIC_POLLER, VARIABLE, describe, serve_environment

ROOT = Path(__file__).resolve().parents[3]


def test_serve_chooses_the_classic_poller_when_nobody_else_did() -> None:
    environ: dict[str, str] = {}
    assert serve_environment(environ) == CLASSIC_POLLER
    assert environ == {VARIABLE: CLASSIC_POLLER}
    assert describe(CLASSIC_POLLER).startswith("classic")


def test_an_operators_choice_is_left_alone_an_empty_one_too() -> None:
    for chosen in ("", "-event_engine_client", "event_engine_listener"):
        environ = {VARIABLE: chosen}
        assert serve_environment(environ) == chosen
        assert environ == {VARIABLE: chosen}
    assert describe("") == "grpc's default (EventEngine)"
    assert "event_engine_listener" in describe("event_engine_listener")


def test_the_command_loads_no_grpc_before_main_runs() -> None:
    # what the console script imports (services.cli:main) and what `python -m services.cli` runs
    code = "import sys, services.cli, services.cli.poller; print('grpc' in sys.modules)"
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert done.stdout.strip() == "False", done.stderr


def test_clients_keep_their_own_processes_choice() -> None:
    # `mmgate generate`, `stats` and `bench` are clients: they set nothing
    code = (
        "import os, sys; from services.cli import main\n"
        "try:\n    main(['stats', '--target', '127.0.0.1:1', '--timeout', '0.1'])\n"
        "except SystemExit:\n    pass\n"
        "print(os.environ.get('GRPC_EXPERIMENTS', 'unset'))"
    )
    env = {"PATH": ""}
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.stdout.strip().splitlines()[-1] == "unset", done.stdout + done.stderr
