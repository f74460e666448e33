"""The second tier's value format: tensors of every dtype mmgate caches come back bit for bit, and
anything that is not a whole value mmgate wrote for that stage is refused (BadValue), never
decoded into something served."""

from __future__ import annotations

import pytest
import torch

from services.engine.values import (
    BadValue,
    seal,
    seal_json,
    seal_tensor,
    unseal_json,
    unseal_tensor,
)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_a_tensor_comes_back_bit_for_bit(dtype: torch.dtype) -> None:
    tensor = torch.randn(16, 32).to(dtype)
    back = unseal_tensor(seal_tensor("embedding", tensor), "embedding")
    assert back.dtype == dtype
    assert torch.equal(back, tensor)


def test_json_comes_back() -> None:
    value = {"deltas": [["Paris", [42], "stop", 0, 7]]}
    assert unseal_json(seal_json("response", value), "response") == value


def swap_header(data: bytes, old: bytes, new: bytes) -> bytes:
    """The same payload under an edited header (its length field kept true)."""
    start = 7 + 1 + 4
    size = int.from_bytes(data[8:12], "big")
    header = data[start : start + size].replace(old, new)
    return data[:8] + len(header).to_bytes(4, "big") + header + data[start + size :]


GOOD = seal_tensor("embedding", torch.ones(4, 8))
NOT_SAFETENSORS = seal("tensor", "embedding", b"\x00" * 64, dtype="float32", shape=[4])
WRONG_SHAPE = swap_header(GOOD, b"[4,8]", b"[8,4]")
WRONG_DTYPE = swap_header(GOOD, b"float32", b"float16")


@pytest.mark.parametrize(
    ("name", "data", "reason"),
    [
        ("empty", b"", "not an mmgate value"),
        ("foreign", b"\x80\x04\x95 a pickle, perhaps", "not an mmgate value"),
        ("another version", GOOD[:7] + b"\x02" + GOOD[8:], "format version 2"),
        ("truncated header", GOOD[:20], "truncated header"),
        ("truncated payload", GOOD[:-5], "payload of"),
        ("a flipped byte", GOOD[:-1] + bytes([GOOD[-1] ^ 1]), "digest does not match"),
        ("another stage", seal_tensor("other", torch.ones(4, 8)), "stage 'other'"),
        ("another kind", seal_json("embedding", [1]), "a 'json' value"),
        ("not safetensors", NOT_SAFETENSORS, "safetensors"),
        ("the header lies about the shape", WRONG_SHAPE, "not the header's"),
        ("the header lies about the dtype", WRONG_DTYPE, "not the header's"),
    ],
)  # fmt: skip
def test_anything_else_is_refused(name: str, data: bytes, reason: str) -> None:
    with pytest.raises(BadValue, match=reason):
        unseal_tensor(data, "embedding")
