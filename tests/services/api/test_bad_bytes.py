"""Bytes that are not a message get INVALID_ARGUMENT in mmgate's words, for every RPC, and the
server keeps serving: raw bytes on a real channel, no client library in between."""

import grpc
import pytest
from google.protobuf.descriptor import FieldDescriptor
from grpc_health.v1 import health_pb2

from services.client import MmgateClient
from services.proto.mmgate.v1 import cache_pb2, inference_pb2
from tests.support import RunningServer

METHODS = {
    "Generate": ("/mmgate.v1.Inference/Generate", "unary_stream", inference_pb2.GenerateRequest),
    "Complete": ("/mmgate.v1.Inference/Complete", "unary_unary", inference_pb2.GenerateRequest),
    "GetStats": ("/mmgate.v1.Cache/GetStats", "unary_unary", cache_pb2.GetStatsRequest),
    "Prefetch": ("/mmgate.v1.Cache/Prefetch", "unary_unary", cache_pb2.PrefetchRequest),
    "Inspect": ("/mmgate.v1.Cache/Inspect", "unary_unary", cache_pb2.InspectRequest),
    "Invalidate": ("/mmgate.v1.Cache/Invalidate", "unary_unary", cache_pb2.InvalidateRequest),
    "Health.Check": ("/grpc.health.v1.Health/Check", "unary_unary", health_pb2.HealthCheckRequest),
}


def bad_utf8(message: type) -> bytes | None:
    """The first string field of ``message`` holding bytes that are not UTF-8."""
    for field in message.DESCRIPTOR.fields:  # type: ignore[attr-defined]
        if field.type == FieldDescriptor.TYPE_STRING:
            return bytes([field.number << 3 | 2, 2, 0xFF, 0xFE])
    return None


CASES = [
    # a length-delimited field whose length runs past the end of the message
    *((method, "truncated field", b"\x0a\xff\x01abc") for method in METHODS),
    # a field tag of wire type 7, which does not exist
    *((method, "bad wire type", b"\x0f\x00") for method in METHODS),
    *(
        (method, "invalid UTF-8", payload)
        for method, (_, _, message) in METHODS.items()
        if (payload := bad_utf8(message)) is not None
    ),
]


@pytest.mark.parametrize(
    ("method", "payload"), [(m, b) for m, _, b in CASES], ids=[f"{m}-{n}" for m, n, _ in CASES]
)
async def test_unparseable_bytes_get_invalid_argument(
    server: RunningServer, client: MmgateClient, method: str, payload: bytes
) -> None:
    path, kind, message = METHODS[method]
    with pytest.raises(Exception):  # noqa: B017, PT011 - the bytes really are unparseable
        message.FromString(payload)

    async def send() -> None:
        async with grpc.aio.insecure_channel(server.target) as channel:
            # no serializers: the bytes go on the wire as they are
            call = getattr(channel, kind)(path)
            if kind == "unary_stream":
                async for _ in call(payload, timeout=30):
                    pass
            else:
                await call(payload, timeout=30)

    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await send()
    error = caught.value
    details = error.details() or ""
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, (error.code(), details)
    assert details == "the request is not a valid protobuf message for this method"
    # the server still serves
    assert (await client.complete("Hi", max_tokens=2)).final.usage.completion_tokens > 0
