"""An OTLP trace receiver for tests: the collector's TraceService over grpc.aio on a loopback port.

It keeps every span it is sent, as :class:`ReceivedSpan`, and wakes whoever waits for spans.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1 import common_pb2


@dataclass(frozen=True)
class ReceivedSpan:
    name: str
    trace_id: str
    span_id: str
    parent_id: str  # "" for a root span
    service: str
    status_code: int  # 0 unset, 1 ok, 2 error
    attributes: dict[str, Any] = field(default_factory=dict)
    links: tuple[str, ...] = ()  # span ids linked to
    start_ns: int = 0  # the sender's clock (Unix epoch, nanoseconds)
    end_ns: int = 0


def _value(value: common_pb2.AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return tuple(_value(v) for v in value.array_value.values)
    return getattr(value, kind) if kind else None


class OtlpReceiver(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.requests = 0
        self._arrived = asyncio.Event()
        self._server = grpc.aio.server()
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self, self._server)
        self.port = self._server.add_insecure_port("127.0.0.1:0")

    async def Export(
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: Any
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        self.requests += 1
        for resource_spans in request.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    self.spans.append(
                        ReceivedSpan(
                            name=span.name,
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_id=span.parent_span_id.hex(),
                            service=str(resource.get("service.name", "")),
                            status_code=span.status.code,
                            attributes={a.key: _value(a.value) for a in span.attributes},
                            links=tuple(link.span_id.hex() for link in span.links),
                            start_ns=span.start_time_unix_nano,
                            end_ns=span.end_time_unix_nano,
                        )
                    )
        self._arrived.set()
        return trace_service_pb2.ExportTraceServiceResponse()

    async def until(
        self, found: Callable[[list[ReceivedSpan]], bool], timeout: float = 30.0
    ) -> list[ReceivedSpan]:
        """The spans received, once ``found`` says they are all there."""
        async with asyncio.timeout(timeout):
            while not found(self.spans):
                self._arrived.clear()
                if found(self.spans):
                    break
                await self._arrived.wait()
        return self.spans

    async def start(self) -> None:
        await self._server.start()

    async def stop(self) -> None:
        await self._server.stop(0)
