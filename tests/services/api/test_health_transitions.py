"""Health follows the cache actor and the engine (in process; no engine is started here)."""

from pathlib import Path

from grpc_health.v1 import health_pb2

from services.api.server import INFERENCE, LIVENESS, READINESS, MmgateServer
from services.config import Settings

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


async def status(server: MmgateServer, service: str) -> int:
    response = await server.health.Check(health_pb2.HealthCheckRequest(service=service), None)
    result: int = response.status
    return result


async def test_readiness_needs_the_engine_and_liveness_the_actor(tmp_path: Path) -> None:
    server = MmgateServer(Settings(port=0, metrics={"port": 0}), model=str(tmp_path))
    server.cache.start()
    try:
        await server.refresh_health()
        # the engine is not started: alive, not ready
        assert await status(server, LIVENESS) == SERVING
        assert await status(server, READINESS) == NOT_SERVING
        assert await status(server, "") == NOT_SERVING
        assert await status(server, INFERENCE) == NOT_SERVING

        await server.cache.aclose()  # the actor is gone: not even alive
        await server.refresh_health()
        assert await status(server, LIVENESS) == NOT_SERVING
        assert await status(server, READINESS) == NOT_SERVING
    finally:
        await server.cache.aclose()
        await server.server.stop(None)
