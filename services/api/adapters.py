"""LoRA adapters at the edge: who may use which, and where an admin may load them from.

GenerateRequest.adapter, else the caller's default ─▶ may the caller use it? ─▶ served?
    no to either ─▶ NOT_FOUND (ADAPTER_NOT_FOUND): the same answer, so a tenant cannot tell
    another's adapter from none
LoadAdapter(name, path): an admin's; the path resolved (links followed) under the adapter
    root, or refused before anything is read
"""

from __future__ import annotations

import re
from pathlib import Path

from ..config import ADAPTER_NAME
from ..engine.worker import EngineWorker
from ..errors import AdapterNotFound, AdapterRefused, NotPermitted
from ..proto.mmgate.v1 import inference_pb2 as pb
from ..types import AdapterRef
from ..wire import ADMIN_ONLY
from .auth import Caller


def adapter_for(caller: Caller, named: str, engine: EngineWorker) -> AdapterRef | None:
    """The adapter a request is answered through; None: the base model."""
    name = named or caller.default_adapter
    if not name:
        return None
    if not caller.may_use(name):
        raise AdapterNotFound(name)
    return engine.adapter(name)


def usable(caller: Caller, engine: EngineWorker) -> list[pb.Adapter]:
    """The adapters served now that ``caller`` may name, by name."""
    refs = sorted(engine.served_adapters(), key=lambda ref: ref.name)
    return [adapter_message(ref) for ref in refs if caller.may_use(ref.name)]


def adapter_message(ref: AdapterRef) -> pb.Adapter:
    return pb.Adapter(name=ref.name, digest=ref.digest, rank=ref.rank)


def admin_only(caller: Caller, call: str) -> None:
    if not caller.admin:
        raise NotPermitted(f"{call} is an admin's", ADMIN_ONLY)


def checked_name(name: str) -> str:
    if re.fullmatch(ADAPTER_NAME, name) is None:
        raise AdapterRefused("name", "1 to 64 letters, digits, '.', '-' or '_'")
    return name


def folder_under(root: Path | None, path: str) -> Path:
    """``path`` (absolute, or relative to ``root``) as a folder inside ``root``, links followed:
    a link or ``..`` pointing out of the root is refused like any other path outside it."""
    if root is None:
        raise AdapterRefused(
            "path", "this server loads no adapters at run time (no adapter root is set)"
        )
    if not path or "\0" in path:
        raise AdapterRefused("path", "a folder under the server's adapter root is required")
    base = root.resolve()
    try:
        folder = (base / path).resolve()
        inside = folder.is_relative_to(base)
        found = inside and folder.is_dir()
    except (OSError, RuntimeError):  # a name too long, a loop of links
        raise AdapterRefused("path", "not a folder that can be read") from None
    if not inside:
        raise AdapterRefused("path", "not under the server's adapter root")
    if not found:
        raise AdapterRefused("path", "no such folder under the server's adapter root")
    return folder


__all__ = [
    "adapter_for",
    "adapter_message",
    "admin_only",
    "checked_name",
    "folder_under",
    "usable",
]
