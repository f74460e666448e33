"""LoRA adapters at the edge: who may use which, and where an admin may load them from.

GenerateRequest.adapter, else the caller's default ─▶ may the caller use it? ─▶ served?
    no to either ─▶ NOT_FOUND (ADAPTER_NOT_FOUND): the same answer, so a tenant cannot tell
    another's adapter from none
LoadAdapter(name, path): an admin's; the path resolved (links followed) under the adapter
    root, or refused before anything is read
"""

from __future__ import annotations

from ..engine.protocol import ServedEngine
from ..errors import AdapterNotFound, NotPermitted
from ..proto.mmgate.v1 import inference_pb2 as pb
from ..types import AdapterRef
from ..wire import ADMIN_ONLY
from .auth import Caller


def adapter_for(caller: Caller, named: str, engine: ServedEngine) -> AdapterRef | None:
    """The adapter a request is answered through; None: the base model."""
    name = named or caller.default_adapter
    if not name:
        return None
    if not caller.may_use(name):
        raise AdapterNotFound(name)
    return engine.adapter(name)


def usable(caller: Caller, engine: ServedEngine) -> list[pb.Adapter]:
    """The adapters served now that ``caller`` may name, by name."""
    refs = sorted(engine.served_adapters(), key=lambda ref: ref.name)
    return [adapter_message(ref) for ref in refs if caller.may_use(ref.name)]


def adapter_message(ref: AdapterRef) -> pb.Adapter:
    return pb.Adapter(name=ref.name, digest=ref.digest, rank=ref.rank)


def admin_only(caller: Caller, call: str) -> None:
    if not caller.admin:
        raise NotPermitted(f"{call} is an admin's", ADMIN_ONLY)


__all__ = [
    "adapter_for",
    "adapter_message",
    "admin_only",
    "usable",
]
