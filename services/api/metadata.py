"""What a call's metadata says: the tenant, and the trace context to hand on."""

from __future__ import annotations

import grpc

from ..errors import InvalidRequest, Violation
from ..wire import DEFAULT_TENANT, TENANT_HEADER, TRACE_HEADERS


def metadata_value(context: grpc.aio.ServicerContext, name: str) -> str | None:
    for key, value in context.invocation_metadata() or ():
        if key == name:
            return value if isinstance(value, str) else value.decode()
    return None


def tenant_of(context: grpc.aio.ServicerContext) -> str:
    """The tenant a call's cache entries belong to: a label (x-mmgate-tenant), not a credential."""
    tenant = metadata_value(context, TENANT_HEADER) or DEFAULT_TENANT
    if len(tenant) > 64 or not tenant.replace("-", "").replace("_", "").isalnum():
        raise InvalidRequest([Violation(TENANT_HEADER, "1 to 64 letters, digits, - and _")])
    return tenant


def trace_headers(context: grpc.aio.ServicerContext) -> dict[str, str]:
    """The client's W3C trace context (traceparent, tracestate), for the engine's own spans."""
    return {name: value for name in TRACE_HEADERS if (value := metadata_value(context, name))}


__all__ = ["metadata_value", "tenant_of", "trace_headers"]
