"""A request's priority: the one it names, within its tenant's range, or the tenant's default.

Lower is more urgent, as vLLM's. The range is the operator's (MMGATE_TENANTS__SCHEDULING): it
keeps a tenant from marking its whole load urgent, which would also make the engine preempt
other tenants' runs first when KV memory runs out.
"""

from __future__ import annotations

from ..config import TenantScheduling
from ..errors import InvalidRequest, Violation
from ..proto.mmgate.v1 import inference_pb2 as pb


def priority_of(message: pb.GenerateRequest, scheduling: TenantScheduling) -> int:
    """The priority the request runs at, or InvalidRequest naming the field."""
    if not message.HasField("priority"):
        return scheduling.priority
    asked, low, high = message.priority, scheduling.min_priority, scheduling.max_priority
    if not low <= asked <= high:
        allowed = f"{low}" if low == high else f"{low} to {high}"
        raise InvalidRequest(
            [Violation("priority", f"{asked} is outside this caller's range ({allowed})")]
        )
    return asked


def scheduling_message(scheduling: TenantScheduling) -> pb.Scheduling:
    return pb.Scheduling(
        weight=scheduling.weight,
        priority=scheduling.priority,
        min_priority=scheduling.min_priority,
        max_priority=scheduling.max_priority,
    )


__all__ = ["priority_of", "scheduling_message"]
