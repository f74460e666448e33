"""Test clips made here with OpenCV's writer (no downloads): valid ones of each container, and
hostile ones made by patching a valid AVI's headers.

    moving_shapes ─▶ cv2.VideoWriter (FFmpeg: MJPG in AVI, mp4v in MP4, VP8 in WebM) ─▶ bytes
    AVI bytes ─▶ RIFF chunks (avih, strh, strf, 00dc) patched in place ─▶ hostile bytes

OpenCV's writer prints "tag ... is not supported with codec id 139" to stderr for VP8 in WebM
(and then writes it with the right tag): harmless noise of the writer, never of the reader.
"""

from __future__ import annotations

import functools
import random
import struct
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import cv2
import numpy as np

# imported first for its side effect: it sets FFmpeg's log level before the writer is the first
# in the process to start OpenCV's FFmpeg backend (OpenCV reads the level once, then)
import services.pipeline.media.video  # noqa: F401

# container -> (file suffix, fourcc) this OpenCV's FFmpeg writes (avc1 does not: no H.264 encoder)
WRITERS: Final = {"avi": (".avi", "MJPG"), "mp4": (".mp4", "mp4v"), "webm": (".webm", "VP80")}

Colour = tuple[int, int, int]


def write_clip(frames: list[np.ndarray], fps: float, container: str = "avi") -> bytes:
    """The clip OpenCV's FFmpeg writer makes of ``frames`` (BGR, all of one size), as bytes."""
    suffix, fourcc = WRITERS[container]
    height, width = frames[0].shape[:2] if frames else (64, 64)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"clip{suffix}"
        writer = cv2.VideoWriter(
            str(path), cv2.CAP_FFMPEG, cv2.VideoWriter.fourcc(*fourcc), fps, (width, height)
        )
        assert writer.isOpened(), f"this OpenCV cannot write {fourcc} in {container}"
        for frame in frames:
            writer.write(frame)
        writer.release()
        return path.read_bytes()


@functools.cache
def moving_shapes(
    frames: int = 16,
    size: tuple[int, int] = (64, 64),
    fps: float = 8.0,
    seed: int = 0,
    container: str = "avi",
) -> bytes:
    """A few coloured shapes moving over a grey background, ``size`` = (width, height); the
    seed picks their colours, places and speeds, so distinct seeds give distinct clips."""
    width, height = size
    rng = random.Random(seed)
    shapes = [
        (
            tuple(rng.randrange(256) for _ in range(3)),
            rng.randrange(width),
            rng.randrange(height),
            rng.choice((-3, -2, 2, 3)),
            rng.choice((-2, -1, 1, 2)),
            rng.randrange(4, max(5, min(width, height) // 3)),
        )
        for _ in range(3)
    ]
    clip = []
    for t in range(frames):
        frame = np.full((height, width, 3), 96, dtype=np.uint8)
        for number, (colour, x, y, dx, dy, side) in enumerate(shapes):
            centre = ((x + dx * t) % width, (y + dy * t) % height)
            if number % 2:
                cv2.circle(frame, centre, side // 2, colour, thickness=-1)
            else:
                corner = (centre[0] + side, centre[1] + side)
                cv2.rectangle(frame, centre, corner, colour, thickness=-1)
        clip.append(frame)
    return write_clip(clip, fps, container)


def solid(
    rgb: Colour, frames: int = 4, size: tuple[int, int] = (64, 64), container: str = "avi"
) -> bytes:
    """Every frame one colour, given as RGB (the writer takes BGR: the test of the codec's
    conversion)."""
    width, height = size
    frame = np.full((height, width, 3), rgb[::-1], dtype=np.uint8)
    return write_clip([frame] * frames, 8.0, container)


def slow_clip(frames: int = 2000, fps: float = 500.0) -> bytes:
    """Many small frames within a short duration (4 s at the defaults): cheap to write, and
    ~0.1 s to decode, so a decode_seconds of a few hundredths is broken by the time alone."""
    return moving_shapes(frames=frames, size=(64, 64), fps=fps, seed=7)


# ── hostile clips ──────────────────────────────────────────────────────────────────────────


def riff_chunks(
    data: bytes | bytearray, start: int = 12, end: int | None = None
) -> Iterator[tuple[bytes, int, int]]:
    """(id, offset of its data, size) of every chunk of a RIFF file, depth first; a LIST's
    data starts with its type ("hdrl", "movi")."""
    end = len(data) if end is None else end
    offset = start
    while offset + 8 <= end:
        chunk_id = bytes(data[offset : offset + 4])
        (size,) = struct.unpack_from("<I", data, offset + 4)
        yield chunk_id, offset + 8, size
        if chunk_id == b"LIST":
            yield from riff_chunks(data, offset + 12, offset + 8 + size)
        offset += 8 + size + (size & 1)


def _first(data: bytearray, chunk_id: bytes) -> int:
    return next(offset for found, offset, _ in riff_chunks(data) if found == chunk_id)


def truncated(clip: bytes) -> bytes:
    """``clip`` cut in the middle of its frame data (an AVI's ``movi`` list; another container
    at half its length)."""
    if clip[:4] != b"RIFF":
        return clip[: len(clip) // 2]
    movi = next(
        (offset, size)
        for chunk_id, offset, size in riff_chunks(clip)
        if chunk_id == b"LIST" and clip[offset : offset + 4] == b"movi"
    )
    return clip[: movi[0] + movi[1] // 2]


def million_frames(frames: int = 1_000_000) -> bytes:
    """A real 16-frame AVI whose headers claim ``frames`` frames (8 fps: 125,000 s): avih
    dwTotalFrames and strh dwLength (FFmpeg, so OpenCV, counts the stream's dwLength)."""
    data = bytearray(moving_shapes())
    struct.pack_into("<I", data, _first(data, b"avih") + 16, frames)
    struct.pack_into("<I", data, _first(data, b"strh") + 32, frames)
    return bytes(data)


def huge_frames(width: int = 16_000, height: int = 16_000) -> bytes:
    """A real 16-frame 64x64 MJPG AVI whose headers claim ``width`` x ``height`` frames: avih
    dwWidth/dwHeight, strh rcFrame, strf biWidth/biHeight, and each JPEG frame's own SOF0 (the
    size FFmpeg, so OpenCV, reports is the JPEG's). FFmpeg accepts sizes of up to ~2^28 pixels;
    at 20000x20000 it refuses the stream's size itself and OpenCV reports 0x0."""
    data = bytearray(moving_shapes())
    struct.pack_into("<II", data, _first(data, b"avih") + 32, width, height)
    struct.pack_into("<hhhh", data, _first(data, b"strh") + 48, 0, 0, width, height)
    struct.pack_into("<ii", data, _first(data, b"strf") + 4, width, height)
    for chunk_id, offset, size in list(riff_chunks(data)):
        if chunk_id == b"00dc":
            sof = data.index(b"\xff\xc0", offset, offset + size)
            # SOF0: marker, length (2), precision (1), then height and width, big-endian
            struct.pack_into(">HH", data, sof + 5, height, width)
    return bytes(data)


def zero_length() -> bytes:
    """An AVI with its headers and no frame: what the writer leaves when nothing is written
    (an MP4 or WebM without frames does not even open)."""
    return write_clip([], 8.0, "avi")


def not_a_video() -> bytes:
    """A PNG image."""
    ok, png = cv2.imencode(".png", np.zeros((8, 8, 3), dtype=np.uint8))
    assert ok
    return png.tobytes()


def fake_magic(seed: int = 0) -> bytes:
    """An MP4's first bytes (an ftyp box), then noise."""
    return b"\x00\x00\x00\x18ftypmp42" + random.Random(seed).randbytes(4096)


__all__ = [
    "WRITERS",
    "fake_magic",
    "huge_frames",
    "million_frames",
    "moving_shapes",
    "not_a_video",
    "riff_chunks",
    "slow_clip",
    "solid",
    "truncated",
    "write_clip",
    "zero_length",
]
