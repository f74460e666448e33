"""Image bytes to pixels: what is accepted, and how it is refused before it costs anything.

    bytes ─▶ sniff (PNG, JPEG, WebP by their magic numbers) ─▶ mime type checked against it
          ─▶ header only: width x height against the limits ─▶ decode ─▶ RGB

CPU-bound and synchronous: the media stage runs ``decode`` in a worker thread.
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass
from typing import Final, final

from PIL import Image

from ...errors import ImageRejected
from ...wire import MIME_TYPES

# mime type -> Pillow's format name; nothing else is decoded (Pillow knows ~40 formats, each a
# parser an attacker could aim at)
FORMATS: Final = dict(zip(MIME_TYPES, ("PNG", "JPEG", "WEBP"), strict=True))
# Pillow names the file object it read in some messages ("<_io.BytesIO object at 0x7f...>"): an
# address of this process, no business of the client's
_OBJECT_REPR: Final = re.compile(r"\s*<[^<>]* at 0x[0-9a-fA-F]+>")
# the pixel count Pillow read from the header, in its DecompressionBomb sentence
_BOMB_PIXELS: Final = re.compile(r"\((\d+) pixels\)")


def limit_pixels(max_pixels: int) -> None:
    """Pillow's own bomb check, process-wide: it warns beyond ``max_pixels`` and refuses beyond
    twice that, as it reads a header (``decode`` answers both in mmgate's words). Set once, as
    the server starts."""
    Image.MAX_IMAGE_PIXELS = max_pixels


def sniff(data: bytes) -> str | None:
    """The mime type the bytes start like, among the supported ones."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if data.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return None


def decode(data: bytes, mime_type: str, *, max_pixels: int, min_side: int) -> Image.Image:
    """Decode one image to RGB, refusing what is too large before any pixel is decoded."""
    sniffed = sniff(data)
    if sniffed is None:
        raise ImageRejected("not a PNG, JPEG or WebP image")
    if mime_type and mime_type != sniffed:
        raise ImageRejected(f"mime_type says {mime_type}, the bytes are {sniffed}")
    try:
        # Image.open reads the header only; Pillow's own bomb check runs there, against
        # Image.MAX_IMAGE_PIXELS (limit_pixels), and decoding waits for load()
        with Image.open(io.BytesIO(data), formats=[FORMATS[sniffed]]) as image:
            width, height = image.size
            if width * height > max_pixels:
                raise ImageRejected(
                    f"{width}x{height} = {width * height} pixels; the limit is {max_pixels}"
                )
            if min(width, height) < min_side:
                raise ImageRejected(f"{width}x{height} pixels; each side needs {min_side} or more")
            image.load()
            return image.convert("RGB")
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        # Pillow's sentence cites its own threshold (twice the limit); mmgate states its own
        declared = _BOMB_PIXELS.search(str(exc))
        size = f"{declared.group(1)} pixels" if declared else "more pixels than that"
        raise ImageRejected(
            f"decompression bomb refused: {size}; the limit is {max_pixels}"
        ) from None
    except (OSError, SyntaxError, ValueError, EOFError) as exc:
        if isinstance(exc, ImageRejected):
            raise
        if str(exc).startswith("Decompressed data too large"):
            # Pillow names its own constant (PngImagePlugin.MAX_TEXT_CHUNK) here
            raise ImageRejected(
                f"corrupt {sniffed} image: a compressed chunk inflates past the limit (a zlib bomb)"
            ) from None
        reason = _OBJECT_REPR.sub("", str(exc)) or type(exc).__name__
        raise ImageRejected(f"corrupt {sniffed} image: {reason}") from None


@final
@dataclass(frozen=True, slots=True)
class DecodedImage:
    image: Image.Image
    digest: str

    @property
    def nbytes(self) -> int:
        width, height = self.image.size
        return width * height * 3


__all__ = ["FORMATS", "DecodedImage", "decode", "limit_pixels", "sniff"]
