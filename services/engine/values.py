"""The second tier's value format: versioned, checked, never pickled.

    b"MMGATE" 0x00 │ version (1 byte) │ header length (4 bytes, big-endian) │ header │ payload
    header: JSON {"kind", "stage", "length", "sha256", and for a tensor "dtype", "shape"}
    payload: a tensor as safetensors (bf16 included: no numpy on the way), or UTF-8 JSON

``seal`` writes one; ``unseal`` checks everything before it trusts a byte: the magic, the version,
the header, the stage it was written for, the payload's length and SHA-256, and for a tensor that
safetensors holds exactly one tensor of the header's dtype and shape. Any failure raises
``BadValue`` (the tier counts it as a miss). Here, in the engine layer, because torch is.
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any, Final, Literal

if TYPE_CHECKING:
    import torch

MAGIC: Final = b"MMGATE\x00"
VERSION: Final = 1
_PREFIX: Final = len(MAGIC) + 1 + 4
# no header of ours comes near this: a length beyond it is not one of our values
_MAX_HEADER: Final = 4096
Kind = Literal["tensor", "json"]


class BadValue(ValueError):
    """Bytes under one of mmgate's keys that are not a value mmgate wrote (or not whole)."""


def seal(kind: Kind, stage: str, payload: bytes, **fields: Any) -> bytes:
    header = {
        "kind": kind,
        "stage": stage,
        "length": len(payload),
        "sha256": hashlib.sha256(payload).hexdigest(),
        **fields,
    }
    encoded = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    return b"".join((MAGIC, bytes([VERSION]), len(encoded).to_bytes(4, "big"), encoded, payload))


def unseal(data: bytes, kind: Kind, stage: str) -> tuple[dict[str, Any], memoryview]:
    """The header and the payload of a value, once every check has passed."""
    if len(data) < _PREFIX or not data.startswith(MAGIC):
        raise BadValue("not an mmgate value")
    version = data[len(MAGIC)]
    if version != VERSION:
        raise BadValue(f"format version {version}, this mmgate reads {VERSION}")
    size = int.from_bytes(data[len(MAGIC) + 1 : _PREFIX], "big")
    if size > _MAX_HEADER or _PREFIX + size > len(data):
        raise BadValue("truncated header")
    try:
        header = json.loads(data[_PREFIX : _PREFIX + size])
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise BadValue("unreadable header") from None
    if not isinstance(header, dict):
        raise BadValue("unreadable header")
    if header.get("kind") != kind or header.get("stage") != stage:
        raise BadValue(f"a {header.get('kind')!r} value of stage {header.get('stage')!r}")
    payload = memoryview(data)[_PREFIX + size :]
    if header.get("length") != len(payload):
        raise BadValue(f"payload of {len(payload)} bytes, the header says {header.get('length')}")
    if header.get("sha256") != hashlib.sha256(payload).hexdigest():
        raise BadValue("payload digest does not match")
    return header, payload


def seal_tensor(stage: str, tensor: torch.Tensor) -> bytes:
    from safetensors.torch import save

    tensor = tensor.detach().contiguous()
    payload = save({"value": tensor})
    return seal(
        "tensor",
        stage,
        payload,
        dtype=str(tensor.dtype).removeprefix("torch."),
        shape=list(tensor.shape),
    )


def unseal_tensor(data: bytes, stage: str) -> torch.Tensor:
    from safetensors import SafetensorError
    from safetensors.torch import load

    header, payload = unseal(data, "tensor", stage)
    try:
        tensors = load(bytes(payload))
    except (SafetensorError, ValueError, RuntimeError) as exc:
        raise BadValue(f"not a safetensors payload ({exc})") from None
    if set(tensors) != {"value"}:
        raise BadValue("the payload does not hold exactly one tensor")
    tensor = tensors["value"]
    dtype = str(tensor.dtype).removeprefix("torch.")
    if dtype != header.get("dtype") or list(tensor.shape) != header.get("shape"):
        raise BadValue(f"a {dtype} tensor of shape {list(tensor.shape)}, not the header's")
    return tensor


def seal_json(stage: str, value: Any) -> bytes:
    return seal("json", stage, json.dumps(value, separators=(",", ":")).encode())


def unseal_json(data: bytes, stage: str) -> Any:
    _, payload = unseal(data, "json", stage)
    try:
        return json.loads(bytes(payload))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise BadValue("unreadable JSON payload") from None


__all__ = [
    "MAGIC",
    "VERSION",
    "BadValue",
    "seal",
    "seal_json",
    "seal_tensor",
    "unseal",
    "unseal_json",
    "unseal_tensor",
]
