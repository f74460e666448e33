"""A real mmgate server started against a real password-protected redis-server with the wrong
password: the start check logs one warning that says so (never the password), and the server
serves anyway, without the tier (it is optional)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from services.client import build_request
from tests.redis_support import RedisProcess, redis_server
from tests.support import RunningServer, start_server

WRONG = "not-the-password"


@pytest.fixture
def guarded_redis(tmp_path: Path) -> Iterator[RedisProcess]:
    server = redis_server(tmp_path, password="s3cret")
    yield server
    server.stop()


@pytest.fixture
def server(tiny_model: str, tmp_path: Path, guarded_redis: RedisProcess) -> Iterator[RunningServer]:
    running = start_server(
        tmp_path,
        tiny_model,
        MMGATE_REDIS__URL=f"redis://:{WRONG}@127.0.0.1:{guarded_redis.port}/0",
    )
    yield running
    assert running.stop() == 0, running.log()


async def test_a_wrong_redis_password_is_logged_at_start_and_mmgate_serves_without_the_tier(
    server: RunningServer,
) -> None:
    # start_server returned: health said SERVING
    log = server.log_path.read_text(errors="replace")
    warning = (
        "second tier: Redis refused the credentials; serving without it until it answers "
        "(every lookup is a miss)"
    )
    assert log.count(warning) == 1, server.log()
    assert WRONG not in log
    async with server.client(timeout=60.0) as client:
        answer = await client.complete_request(build_request("Say hello.", max_tokens=4))
    assert answer.final.usage.completion_tokens >= 1
