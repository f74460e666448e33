"""The second tier's value format: tensors of every dtype mmgate caches come back bit for bit, and
anything that is not a whole value mmgate wrote for that stage and that key (and, with a
deployment secret, signed with it) is refused (BadValue), never decoded into something served."""

from __future__ import annotations

import pytest
import torch

from services.engine.values import (
    BadValue,
    seal,
    seal_json,
    seal_tensor,
    unseal,
    unseal_json,
    unseal_tensor,
)

KEY = "mmgate:ns:t:embedding:abc"
RESPONSE_KEY = "mmgate:ns:t:response:k1"
SECRET = b"the deployment's secret"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_a_tensor_comes_back_bit_for_bit(dtype: torch.dtype) -> None:
    tensor = torch.randn(16, 32).to(dtype)
    back = unseal_tensor(seal_tensor("embedding", tensor, key=KEY), "embedding", key=KEY)
    assert back.dtype == dtype
    assert torch.equal(back, tensor)


def test_json_comes_back() -> None:
    value = {"deltas": [["Paris", [42], "stop", 0, 7]]}
    sealed = seal_json("response", value, key=RESPONSE_KEY)
    assert unseal_json(sealed, "response", key=RESPONSE_KEY) == value


def swap_header(data: bytes, old: bytes, new: bytes) -> bytes:
    """The same payload under an edited header (its length field kept true)."""
    start = 7 + 1 + 4
    size = int.from_bytes(data[8:12], "big")
    header = data[start : start + size].replace(old, new)
    return data[:8] + len(header).to_bytes(4, "big") + header + data[start + size :]


GOOD = seal_tensor("embedding", torch.ones(4, 8), key=KEY)
NOT_SAFETENSORS = seal("tensor", "embedding", b"\x00" * 64, key=KEY, dtype="float32", shape=[4])
WRONG_SHAPE = swap_header(GOOD, b"[4,8]", b"[8,4]")
WRONG_DTYPE = swap_header(GOOD, b"float32", b"float16")


@pytest.mark.parametrize(
    ("name", "data", "reason"),
    [
        ("empty", b"", "not an mmgate value"),
        ("foreign", b"\x80\x04\x95 a pickle, perhaps", "not an mmgate value"),
        ("another version", GOOD[:7] + b"\x01" + GOOD[8:], "format version 1"),
        ("truncated header", GOOD[:20], "truncated header"),
        ("truncated payload", GOOD[:-5], "payload of"),
        ("a flipped byte", GOOD[:-1] + bytes([GOOD[-1] ^ 1]), "digest does not match"),
        ("another stage", seal_tensor("other", torch.ones(4, 8), key=KEY), "stage 'other'"),
        ("another kind", seal_json("embedding", [1], key=KEY), "a 'json' value"),
        ("not safetensors", NOT_SAFETENSORS, "safetensors"),
        ("the header lies about the shape", WRONG_SHAPE, "not the header's"),
        ("the header lies about the dtype", WRONG_DTYPE, "not the header's"),
    ],
)  # fmt: skip
def test_anything_else_is_refused(name: str, data: bytes, reason: str) -> None:
    with pytest.raises(BadValue, match=reason):
        unseal_tensor(data, "embedding", key=KEY)


@pytest.mark.parametrize(
    "other",
    [
        "mmgate:ns:t:response:k2",  # another prompt of the same tenant
        "mmgate:ns:u:response:k1",  # the same prompt of another tenant
        "mmgate:other-ns:t:response:k1",  # another model's namespace
        "mmgate:ns:t:response:k1 ",
    ],
)
def test_a_value_read_under_another_key_is_refused_without_naming_its_own(other: str) -> None:
    sealed = seal_json("response", {"deltas": [["Paris", [42], "stop", 0, 7]]}, key=RESPONSE_KEY)
    with pytest.raises(BadValue) as refused:
        unseal_json(sealed, "response", key=other)
    assert str(refused.value) == "stored under another key"  # its own key, never named


def test_the_key_is_in_the_checked_header() -> None:
    header, _ = unseal(GOOD, "tensor", "embedding", key=KEY)
    assert header["key"] == KEY
    # an edited key field in an unsigned value moves it nowhere: the reader's key must match
    other = "mmgate:ns:u:embedding:abc"
    moved = swap_header(GOOD, KEY.encode(), other.encode())
    unseal(moved, "tensor", "embedding", key=other)
    with pytest.raises(BadValue, match="another key"):
        unseal(moved, "tensor", "embedding", key=KEY)


def test_a_signed_value_comes_back_with_the_secret() -> None:
    value = {"deltas": [["Paris", [42], "stop", 0, 7]]}
    sealed = seal_json("response", value, key=RESPONSE_KEY, secret=SECRET)
    assert unseal_json(sealed, "response", key=RESPONSE_KEY, secret=SECRET) == value
    tensor = torch.randn(3, 5).to(torch.bfloat16)
    back = unseal_tensor(
        seal_tensor("embedding", tensor, key=KEY, secret=SECRET),
        "embedding",
        key=KEY,
        secret=SECRET,
    )
    assert torch.equal(back, tensor)


SIGNED = seal_tensor("embedding", torch.ones(4, 8), key=KEY, secret=SECRET)


@pytest.mark.parametrize(
    ("name", "data", "reason"),
    [
        ("unsigned", GOOD, "not signed with this deployment's secret"),
        ("another secret", seal_tensor("embedding", torch.ones(4, 8), key=KEY, secret=b"other"),
         "not signed with this deployment's secret"),
        # the key edited to the reader's, the MAC left as it was
        ("signed for another key",
         swap_header(seal_tensor("embedding", torch.ones(4, 8), key=KEY + "x", secret=SECRET),
                     (KEY + "x").encode(), KEY.encode()),
         "not signed with this deployment's secret"),
        ("the shape edited", swap_header(SIGNED, b"[4,8]", b"[8,4]"),
         "not signed with this deployment's secret"),
        # a whole signed value, moved: its MAC holds, its key does not
        ("moved whole", seal_tensor("embedding", torch.ones(4, 8), key=KEY + "x", secret=SECRET),
         "stored under another key"),
        # the header untouched (its MAC holds), the payload not the one it names
        ("a flipped payload byte", SIGNED[:-1] + bytes([SIGNED[-1] ^ 1]), "digest does not match"),
    ],
)  # fmt: skip
def test_with_a_secret_only_a_value_signed_for_this_key_is_read(
    name: str, data: bytes, reason: str
) -> None:
    with pytest.raises(BadValue, match=reason):
        unseal_tensor(data, "embedding", key=KEY, secret=SECRET)


def test_a_signed_value_is_refused_where_no_secret_is_configured() -> None:
    with pytest.raises(BadValue, match="signed with a secret, and this deployment has none"):
        unseal_tensor(SIGNED, "embedding", key=KEY)


def test_the_mac_covers_the_header_and_the_payload_digest() -> None:
    header, _ = unseal(SIGNED, "tensor", "embedding", key=KEY, secret=SECRET)
    assert set(header) == {"kind", "stage", "key", "length", "sha256", "dtype", "shape", "mac"}
    assert len(header["mac"]) == 64  # hex HMAC-SHA256
