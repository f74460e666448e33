"""Test images made here: valid ones of each format, and hostile ones."""

from __future__ import annotations

import io
import random
import struct
import zlib

from PIL import Image


def picture(seed: int, size: tuple[int, int] = (64, 48)) -> Image.Image:
    rng = random.Random(seed)
    return Image.frombytes("RGB", size, rng.randbytes(size[0] * size[1] * 3))


def encoded(image: Image.Image, fmt: str = "PNG") -> bytes:
    out = io.BytesIO()
    image.save(out, format=fmt)
    return out.getvalue()


def png(seed: int, size: tuple[int, int] = (64, 48)) -> bytes:
    return encoded(picture(seed, size), "PNG")


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def png_bomb(side: int = 40_000) -> bytes:
    """A PNG declaring side x side grey pixels (1.6 billion) in a few hundred bytes: its zlib
    stream of zero rows would inflate to gigabytes if anything tried to decode it."""
    header = struct.pack(">IIBBBBB", side, side, 8, 0, 0, 0, 0)
    rows = zlib.compress(b"\x00" * (side + 1) * 64, 9)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _chunk(b"IHDR", header)
        + _chunk(b"IDAT", rows)
        + _chunk(b"IEND", b"")
    )


def corrupt_png(seed: int) -> bytes:
    """A real PNG's signature and header, then garbage where the pixels should be."""
    data = bytearray(png(seed))
    rng = random.Random(seed)
    for i in range(40, len(data) - 12):
        data[i] = rng.randrange(256)
    return bytes(data)


def large_png(side: int = 6000) -> bytes:
    """side x side pixels (36 MP by default) that compress well: ~3 MB, ~0.5 s to decode."""
    from PIL import ImageDraw

    image = Image.new("RGB", (side, side), (200, 30, 40))
    draw = ImageDraw.Draw(image)
    for x in range(0, side, 50):
        draw.line([(x, 0), (side - x, side)], fill=(x % 255, 100, 200), width=3)
    out = io.BytesIO()
    image.save(out, format="PNG", compress_level=1)
    return out.getvalue()


def variant(data: bytes, number: int) -> bytes:
    """The same PNG with a text chunk of its own: another digest, the same pixels to decode."""
    return data[:-12] + _chunk(b"tEXt", b"variant\x00" + str(number).encode()) + data[-12:]
