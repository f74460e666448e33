"""The grpc.aio server itself: its options, the services it carries, its port.

    grpc_server(settings, interceptors) ─▶ add_services(server, inference, cache, health)
        ─▶ open_port(server, settings, tls) ─▶ the port (0 in the settings: a free one)

Reflection lists every service; health and reflection answer callers without credentials
unless the settings protect them (``open_services``).
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection

from ..config import AuthSettings, Settings
from ..proto.mmgate.v1 import cache_pb2, cache_pb2_grpc, inference_pb2, inference_pb2_grpc
from .auth import CertificateFiles
from .connections import connection_options

INFERENCE = inference_pb2.DESCRIPTOR.services_by_name["Inference"].full_name
CACHE = cache_pb2.DESCRIPTOR.services_by_name["Cache"].full_name
HEALTH = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name


def open_services(settings: AuthSettings) -> frozenset[str]:
    """The services callers reach without credentials (the probes', unless protected)."""
    services = set()
    if not settings.protect_health:
        services.add(HEALTH)
    if not settings.protect_reflection:
        services.update({reflection.SERVICE_NAME, "grpc.reflection.v1.ServerReflection"})
    return frozenset(services)


def grpc_server(
    settings: Settings,
    interceptors: Sequence[grpc.aio.ServerInterceptor],
    *,
    shared_port: bool = False,
) -> grpc.aio.Server:
    """The grpc.aio server, its message limits and connection policy (no port yet);
    ``shared_port``: one of the edges that listen on the same port (SO_REUSEPORT)."""
    return grpc.aio.server(
        interceptors=interceptors,
        options=[
            # messages up to twice the limit reach validation, which names the field;
            # beyond that gRPC itself answers RESOURCE_EXHAUSTED
            ("grpc.max_receive_message_length", 2 * settings.max_message_bytes),
            ("grpc.max_send_message_length", settings.max_send_bytes),
            ("grpc.so_reuseport", int(shared_port)),
            *connection_options(settings.connections),
        ],
    )


def served_methods() -> dict[str, tuple[bool, bool]]:
    """Every method add_services serves, by full name: (streams requests, streams responses)."""
    from grpc_reflection.v1alpha import reflection_pb2

    files = (inference_pb2, cache_pb2, health_pb2, reflection_pb2)
    return {
        f"/{service.full_name}/{method.name}": (method.client_streaming, method.server_streaming)
        for file in files
        for service in file.DESCRIPTOR.services_by_name.values()
        for method in service.methods
    }


def add_services(
    server: grpc.aio.Server,
    inference: inference_pb2_grpc.InferenceServicer,
    cache: cache_pb2_grpc.CacheServicer,
    health: HealthServicer,
) -> None:
    inference_pb2_grpc.add_InferenceServicer_to_server(inference, server)
    cache_pb2_grpc.add_CacheServicer_to_server(cache, server)
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    reflection.enable_server_reflection((INFERENCE, CACHE, HEALTH, reflection.SERVICE_NAME), server)


def open_port(server: grpc.aio.Server, settings: Settings, tls: CertificateFiles | None) -> int:
    """The port the server listens on, plaintext or TLS as the settings say."""
    address = f"{settings.host}:{settings.port}"
    if tls is None:
        return int(server.add_insecure_port(address))
    # mtls: a client without a certificate of the client CA fails the handshake, so an
    # unauthenticated caller never reaches a handler (it sees UNAVAILABLE)
    credentials = tls.credentials(require_client_cert=settings.auth.mode == "mtls")
    return int(server.add_secure_port(address, credentials))


__all__ = [
    "CACHE",
    "HEALTH",
    "INFERENCE",
    "add_services",
    "grpc_server",
    "open_port",
    "open_services",
    "served_methods",
]
