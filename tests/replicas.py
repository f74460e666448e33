"""Replicas of mmgate sharing one Redis, as a deployment runs them: real `mmgate serve` on the tiny
LLaVA (embeddings mode, float32, real vLLM), each engine pinned to a core of its own.

The session's pair (tests/conftest.py ``shared_replicas``) serves both the storage tests
(tests/services/storage/test_replicas.py: sharing through Redis, Redis paused and killed) and
the proxy's smoke test (tests/deploy/test_replicas.py: affinity, then a replica killed, last).
"""

from __future__ import annotations

import secrets
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.support import RunningServer, start_server

# what every replica runs with; a breaker the storage tests can count (three failed reads open
# it, for two seconds), and a drain long enough for make mesh's rolling restart
REPLICA_SETTINGS = {
    "MMGATE_MEDIA__MODE": "embeddings",
    "MMGATE_ENGINE__DTYPE": "float32",
    "MMGATE_ENGINE__KV_CACHE_MEMORY_BYTES": str(64 << 20),
    "MMGATE_REDIS__BREAKER_SECONDS": "2",
    "MMGATE_REDIS__BREAKER_FAILURES": "3",
    "MMGATE_SHUTDOWN_GRACE_SECONDS": "30",
}


class Replicas:
    """Replicas sharing the Redis at ``redis_url``, started (and restarted) with the same
    settings; ``settings``: more MMGATE_* variables (a Cluster, a tracing endpoint)."""

    def __init__(self, directory: Path, model: Path, redis_url: str, **settings: str) -> None:
        self.directory, self.model = directory, model
        self.settings = {**REPLICA_SETTINGS, "MMGATE_REDIS__URL": redis_url, **settings}
        self.servers: list[RunningServer] = []

    def start(self, index: int) -> RunningServer:
        logs = self.directory / f"replica-{index}-{secrets.token_hex(3)}"
        logs.mkdir()
        return start_server(
            logs,
            str(self.model),
            VLLM_CPU_OMP_THREADS_BIND=str(index % 2),
            **self.settings,
        )

    def start_all(self, count: int) -> Replicas:
        # engines start at once: the caller waits for the slowest, not for the sum
        with ThreadPoolExecutor(count) as pool:
            starting = [pool.submit(self.start, index) for index in range(count)]
        self.servers = [f.result() for f in starting if f.exception() is None]
        failures = [error for f in starting if (error := f.exception()) is not None]
        if failures:  # leave no replica behind
            self.stop()
            raise failures[0]
        return self

    def stop(self) -> None:
        """Stop the replicas still running (a test may have killed one)."""
        for server in self.servers:
            if server.process.poll() is None:
                server.stop()

    @property
    def pair(self) -> tuple[RunningServer, RunningServer]:
        return self.servers[0], self.servers[1]
