"""The reaper, on real processes: a "server" that dies by SIGKILL or SIGSEGV (no shutdown of its
own) takes its "engine" (a grandchild that would run on, orphaned) with it; one that exits as it
should leaves the reaper nothing to do."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import psutil
import pytest

# a server stand-in: starts the reaper, then an "engine" child of its own, prints the engine's
# pid once the reaper watches it, and waits to be killed (or, with "exit", stops its engine and
# exits when its stdin closes)
SERVER = textwrap.dedent(
    """
    import subprocess, sys
    from services.engine.reaper import spawn_reaper
    reaper = spawn_reaper(stdout=subprocess.PIPE)
    engine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    while int(reaper.stdout.readline()) != engine.pid:  # until the reaper watches it
        pass
    print(engine.pid, flush=True)
    if sys.argv[1] == "exit":
        sys.stdin.read()  # the test has the engine's pid: stop as a server should
        engine.kill()
        engine.wait()
        sys.exit(0)
    sys.stdin.read()
    """
)


def start(mode: str) -> tuple[subprocess.Popen[str], psutil.Process]:
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER, mode],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert server.stdout is not None
    engine = psutil.Process(int(server.stdout.readline()))
    server.stdout.close()
    return server, engine


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSEGV])
def test_a_server_that_dies_takes_its_engine_with_it(sig: signal.Signals) -> None:
    server, engine = start("wait")
    reaper = next(c for c in psutil.Process(server.pid).children() if c.pid != engine.pid)
    # the reaper has seen the engine once it has polled after the engine started
    try:
        server.send_signal(sig)
        server.wait(timeout=30)
        engine.wait(timeout=30)  # killed by the reaper: raises TimeoutExpired otherwise
        reaper.wait(timeout=30)
    finally:
        if engine.is_running():
            engine.kill()
        assert server.stdin is not None
        server.stdin.close()
    assert not engine.is_running()


def test_a_server_that_stops_leaves_the_reaper_nothing_to_do() -> None:
    server, engine = start("exit")
    assert server.stdin is not None
    server.stdin.close()  # its cue: the engine's pid was read before the engine ended
    assert server.wait(timeout=30) == 0
    assert not engine.is_running()
