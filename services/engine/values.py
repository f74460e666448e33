"""The second tier's value format: versioned, checked, bound to its key, never pickled.

    b"MMGATE" 0x00 │ version (1 byte) │ header length (4 bytes, big-endian) │ header │ payload
    header: JSON {"kind", "stage", "key", "length", "sha256", for a tensor "dtype", "shape",
            and with a deployment secret "mac"}
    payload: a tensor as safetensors (bf16 included: no numpy on the way), or UTF-8 JSON
    mac: HMAC-SHA256(secret, MAGIC │ version │ the header without "mac" as canonical JSON)

``seal`` writes one; ``unseal`` checks everything before it trusts a byte: the magic, the version,
the header, the MAC, the full Redis key the value was written under, the stage it was written
for, the payload's length and SHA-256, and for a tensor that safetensors holds exactly one tensor
of the header's dtype and shape. The key check is what stops a value copied under another
prompt's or another tenant's key from being served as that key's answer. Canonical JSON: sorted
keys, no spaces; the MAC covers the magic, the version and every other header field (the key,
kind, stage, length, dtype, shape), and the payload through its SHA-256. Without a secret, the
checks catch a value moved by mistake, not one forged by a writer to Redis; with one, only a
holder of the secret can write a value that is read. Any failure raises ``BadValue`` (the tier
counts it as a miss). Here, in the engine layer, because torch is.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import TYPE_CHECKING, Any, Final, Literal

if TYPE_CHECKING:
    import torch

    from .video_encoder import ClipEmbedding

MAGIC: Final = b"MMGATE\x00"
VERSION: Final = 3
_PREFIX: Final = len(MAGIC) + 1 + 4
# no header of ours comes near this: a length beyond it is not one of our values
_MAX_HEADER: Final = 4096
Kind = Literal["tensor", "json"]


class BadValue(ValueError):
    """Bytes under one of mmgate's keys that are not a value mmgate wrote for that key (or not
    whole)."""


def _canonical(header: dict[str, Any]) -> bytes:
    return json.dumps(header, sort_keys=True, separators=(",", ":")).encode()


def _mac(secret: bytes, header: dict[str, Any]) -> str:
    """The MAC of every header field but "mac" itself (the payload through its SHA-256)."""
    signed = {name: value for name, value in header.items() if name != "mac"}
    message = MAGIC + bytes([VERSION]) + _canonical(signed)
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def seal(
    kind: Kind, stage: str, payload: bytes, *, key: str, secret: bytes | None = None, **fields: Any
) -> bytes:
    """A value for the full Redis ``key`` it is stored under; with ``secret``, MAC'd too."""
    header = {
        **fields,
        "kind": kind,
        "stage": stage,
        "key": key,
        "length": len(payload),
        "sha256": hashlib.sha256(payload).hexdigest(),
    }
    if secret is not None:
        header["mac"] = _mac(secret, header)
    encoded = _canonical(header)
    return b"".join((MAGIC, bytes([VERSION]), len(encoded).to_bytes(4, "big"), encoded, payload))


def unseal(
    data: bytes, kind: Kind, stage: str, *, key: str, secret: bytes | None = None
) -> tuple[dict[str, Any], memoryview]:
    """The header and the payload of a value read under ``key``, once every check has passed."""
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
    _check_mac(header, secret)
    # the value's own key is never echoed: it may be another tenant's
    if header.get("key") != key:
        raise BadValue("stored under another key")
    if header.get("kind") != kind or header.get("stage") != stage:
        raise BadValue(f"a {header.get('kind')!r} value of stage {header.get('stage')!r}")
    payload = memoryview(data)[_PREFIX + size :]
    if header.get("length") != len(payload):
        raise BadValue(f"payload of {len(payload)} bytes, the header says {header.get('length')}")
    if header.get("sha256") != hashlib.sha256(payload).hexdigest():
        raise BadValue("payload digest does not match")
    return header, payload


def _check_mac(header: dict[str, Any], secret: bytes | None) -> None:
    mac = header.get("mac")
    if secret is None:
        # a replica without the secret must not half-trust what the others sign
        if mac is not None:
            raise BadValue("signed with a secret, and this deployment has none")
        return
    if not isinstance(mac, str):
        raise BadValue("not signed with this deployment's secret")
    if not hmac.compare_digest(mac, _mac(secret, header)):
        raise BadValue("not signed with this deployment's secret")


def seal_tensor(
    stage: str, tensor: torch.Tensor, *, key: str, secret: bytes | None = None, **fields: Any
) -> bytes:
    """One tensor; ``fields``: more of the header (a clip's grid), MAC'd with the rest."""
    from safetensors.torch import save

    tensor = tensor.detach().contiguous()
    payload = save({"value": tensor})
    return seal(
        "tensor",
        stage,
        payload,
        key=key,
        secret=secret,
        dtype=str(tensor.dtype).removeprefix("torch."),
        shape=list(tensor.shape),
        **fields,
    )


def unseal_tensor(
    data: bytes, stage: str, *, key: str, secret: bytes | None = None
) -> torch.Tensor:
    from safetensors import SafetensorError
    from safetensors.torch import load

    header, payload = unseal(data, "tensor", stage, key=key, secret=secret)
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


def seal_frames(stage: str, frames: Any, *, key: str, secret: bytes | None = None) -> bytes:
    """A clip's frames, a numpy array of (frames, height, width, 3) RGB bytes, as a tensor."""
    import torch

    return seal_tensor(stage, torch.from_numpy(frames), key=key, secret=secret)


def unseal_frames(data: bytes, stage: str, *, key: str, secret: bytes | None = None) -> Any:
    """A clip's frames read back, checked to be frames (uint8, RGB) before they are trusted."""
    import torch

    tensor = unseal_tensor(data, stage, key=key, secret=secret)
    if tensor.dtype != torch.uint8 or tensor.dim() != 4 or tensor.shape[-1] != 3:
        raise BadValue(f"not a clip's frames: a {tensor.dtype} tensor of {list(tensor.shape)}")
    return tensor.numpy()


def seal_clip(stage: str, clip: ClipEmbedding, *, key: str, secret: bytes | None = None) -> bytes:
    """A clip's encoder output; its patch grid (t, h, w) and frame count in the header."""
    return seal_tensor(
        stage, clip.embeds, key=key, secret=secret, grid=list(clip.grid), frames=clip.frames
    )


def unseal_clip(data: bytes, stage: str, *, key: str, secret: bytes | None = None) -> ClipEmbedding:
    """A clip's encoder output read back: three positive grid sizes whose product the
    embeddings' rows divide (a row a merge of patches) and a positive frame count, checked
    before they are trusted."""
    from .video_encoder import ClipEmbedding

    header, _ = unseal(data, "tensor", stage, key=key, secret=secret)
    grid, frames = header.get("grid"), header.get("frames")
    if not isinstance(grid, list) or len(grid) != 3:
        raise BadValue("not a clip's grid")
    t, h, w = grid
    if not isinstance(frames, int) or not all(
        isinstance(v, int) and v > 0 for v in (t, h, w, frames)
    ):
        raise BadValue("not a clip's grid and frame count")
    tensor = unseal_tensor(data, stage, key=key, secret=secret)
    if tensor.dim() != 2 or (t * h * w) % tensor.shape[0]:
        raise BadValue(f"embeddings of shape {list(tensor.shape)} for a grid of {grid}")
    return ClipEmbedding(tensor, (t, h, w), frames)


def seal_json(stage: str, value: Any, *, key: str, secret: bytes | None = None) -> bytes:
    payload = json.dumps(value, separators=(",", ":")).encode()
    return seal("json", stage, payload, key=key, secret=secret)


def unseal_json(data: bytes, stage: str, *, key: str, secret: bytes | None = None) -> Any:
    _, payload = unseal(data, "json", stage, key=key, secret=secret)
    try:
        return json.loads(bytes(payload))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise BadValue("unreadable JSON payload") from None


__all__ = [
    "MAGIC",
    "VERSION",
    "BadValue",
    "seal",
    "seal_clip",
    "seal_frames",
    "seal_json",
    "seal_tensor",
    "unseal",
    "unseal_clip",
    "unseal_frames",
    "unseal_json",
    "unseal_tensor",
]
