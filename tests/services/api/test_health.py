"""Health (standard grpc.health.v1, liveness and readiness) and reflection."""

import grpc
import pytest
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from services.client import MmgateClient

SERVING = health_pb2.HealthCheckResponse.SERVING


@pytest.mark.parametrize(
    "service", ["", "liveness", "readiness", "mmgate.v1.Inference", "mmgate.v1.Cache"]
)
async def test_serving(client: MmgateClient, service: str) -> None:
    assert await client.health(service) == SERVING


async def test_unknown_service_is_not_found(client: MmgateClient) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await client.health("no.such.Service")
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND


async def test_reflection_lists_the_services(client: MmgateClient) -> None:
    stub = reflection_pb2_grpc.ServerReflectionStub(client.channel)

    async def ask() -> reflection_pb2.ServerReflectionResponse:
        async for response in stub.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=10
        ):
            return response
        raise AssertionError("no reflection answer")

    names = {s.name for s in (await ask()).list_services_response.service}
    assert {"mmgate.v1.Inference", "mmgate.v1.Cache", "grpc.health.v1.Health"} <= names
