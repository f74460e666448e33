"""What a failed call's status carries: its google.rpc details, the fields it names."""

from __future__ import annotations

import grpc


def error_details(error: grpc.aio.AioRpcError) -> list[object]:
    """The google.rpc details a status carries (BadRequest, ErrorInfo)."""
    from google.rpc import error_details_pb2, status_pb2

    for key, value in error.trailing_metadata() or ():
        if key == "grpc-status-details-bin":
            assert isinstance(value, bytes)
            status = status_pb2.Status.FromString(value)
            assert status.code == error.code().value[0]
            found: list[object] = []
            for detail in status.details:
                for kind in (error_details_pb2.BadRequest, error_details_pb2.ErrorInfo):
                    if detail.Is(kind.DESCRIPTOR):
                        message = kind()
                        detail.Unpack(message)
                        found.append(message)
            return found
    return []


def violated_fields(error: grpc.aio.AioRpcError) -> set[str]:
    from google.rpc import error_details_pb2

    return {
        violation.field
        for detail in error_details(error)
        if isinstance(detail, error_details_pb2.BadRequest)
        for violation in detail.field_violations
    }
