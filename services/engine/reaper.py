"""The engine goes with the server: a watcher process that ends the server's engine processes
when the server dies without stopping them.

    mmgate serve ─ spawns ─▶ reaper (its own session: no signal to the server's group reaches it)
        every INTERVAL: the server's descendants, remembered (the engine core, its workers)
        the server gone (a native crash, SIGKILL, an OOM kill) ─▶ each remembered one still
        running is killed, then the reaper exits; a server that stops as it should has stopped
        its engine already, and the reaper finds nothing left

vLLM's engine core does not watch its parent: after a native crash of the server (a grammar
compiler's stack overflow once did it) the engine processes ran on, orphaned, holding the
accelerator's memory. Outside a container nothing else would end them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Final

import psutil

INTERVAL_SECONDS: Final = 1.0


def watch(server_pid: int, interval: float = INTERVAL_SECONDS) -> int:
    """Watch ``server_pid`` until it is gone; then kill the descendants it had. Returns how
    many were killed."""
    try:
        server = psutil.Process(server_pid)
    except psutil.NoSuchProcess:
        return 0
    remembered: dict[int, psutil.Process] = {}
    while True:
        try:
            if server.status() == psutil.STATUS_ZOMBIE:  # dead, not yet waited for
                break
            for child in server.children(recursive=True):
                if child.pid != os.getpid() and child.pid not in remembered:
                    remembered[child.pid] = child
                    print(child.pid, flush=True)  # what it watches, for whoever reads
            server.wait(timeout=interval)  # psutil compares create times: never a reused pid
            break
        except psutil.TimeoutExpired:
            continue
        except psutil.NoSuchProcess:
            break
    killed = 0
    for process in remembered.values():
        try:
            if process.is_running():  # the same process: pid and create time
                process.kill()
                killed += 1
        except psutil.NoSuchProcess:
            pass
    return killed


def spawn_reaper(
    server_pid: int | None = None, stdout: int = subprocess.DEVNULL
) -> subprocess.Popen[bytes]:
    """Start the reaper of ``server_pid`` (this process by default), in a session of its own;
    it writes each pid it watches to ``stdout``."""
    pid = os.getpid() if server_pid is None else server_pid
    return subprocess.Popen(
        [sys.executable, "-m", "services.engine.reaper", str(pid)],
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stdout=stdout,
        stderr=subprocess.DEVNULL,
    )


if __name__ == "__main__":
    watch(int(sys.argv[1]))


__all__ = ["INTERVAL_SECONDS", "spawn_reaper", "watch"]
