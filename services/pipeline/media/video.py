"""Video bytes to sampled RGB frames: what is accepted, and how it is refused before it costs much.

    bytes ─▶ sniff (MP4/MOV, WebM, AVI by their magic numbers) ─▶ mime type checked against it
          ─▶ OpenCV (its FFmpeg backend) opens it from memory: the header only
          ─▶ frame size, frame count, frame rate, duration against the limits
          ─▶ sample_indices (vLLM's uniform rule) ─▶ grab() frame by frame up to the last index
             (stop and the decode deadline checked before each), retrieve() the sampled ones
          ─▶ BGR to RGB, into one (n, height, width, 3) array sized from the header

CPU-bound and synchronous: the video stage runs ``decode_video`` in a worker thread, and sets
``stop`` when nobody waits for the answer any more.

What bounds a hostile clip. The header's frame size (each frame's memory) and duration (frame
count / fps: "a header claiming a million frames" is refused here) are checked before a frame is
decoded; the array handed on is at most ``max_frames`` frames of that size; every grab() (each one
decodes a frame, sampled or not) is preceded by the stop and deadline checks, so a clip that
takes long to decode (many frames, a high frame rate within the duration limit) stops within one
frame of ``decode_seconds``. One grab() is bounded by the bytes in memory (FFmpeg reads at most
OPENCV_FFMPEG_READ_ATTEMPTS packets for it). Not bounded by mmgate: the memory FFmpeg's decoder
takes for a frame whose own bitstream changes size mid-clip (up to FFmpeg's limit of 2^28 pixels)
before the shape check below refuses it; such a frame must really be encoded at that size.

Other resources. FFmpeg can read playlists (HLS, its concat format) that name other files and
URLs; those are text formats FFmpeg recognises by their first bytes ("#EXTM3U", "ffconcat"), so
letting through only the three containers' magic numbers keeps them out. (This build of OpenCV's
FFmpeg does not open them from memory anyway; the sniff does not rely on that.) The MP4 demuxer's
external data references are off by default in FFmpeg.

A clip is read as its header declares it: a clip that ends early (truncated, or an MP4 whose edit
list hides frames its sample table counts) is refused at the first frame it lacks; vLLM instead
shortens the clip to the frames it finds (its end-of-stream seek and its frame recovery), which
would hand the model fewer frames than the sampling asked for, unannounced. A WebM recorded live
(no duration in its header, so no frame count) is refused for the same reason.
"""

from __future__ import annotations

import io
import math
import os
import threading
import time
from dataclasses import dataclass
from typing import Final, cast, final

import cv2
import numpy as np
import numpy.typing as npt

from ...errors import DecodeStopped, VideoRejected
from ...media_types import VideoSampling
from ...wire import VIDEO_MIME_TYPES

# FFmpeg prints what it thinks of hostile bytes to stderr ("moov atom not found", "overread 8"),
# and OpenCV warns that it "can't be used to capture by read data stream": a client could write
# into the server's log at will. OpenCV reads OPENCV_FFMPEG_LOGLEVEL once, when its FFmpeg
# backend first opens anything in the process (a capture or a writer), so it is set here, at
# import, before that; -8 is FFmpeg's AV_LOG_QUIET. setdefault: an operator's own value wins.
# Processes started later inherit it (vLLM's engine core among them, which then logs no FFmpeg
# complaints either).
os.environ.setdefault("OPENCV_FFMPEG_LOGLEVEL", "-8")
# OpenCV's own logging is process-wide; mmgate uses OpenCV for nothing but this
cv2.utils.logging.setLogLevel(cv2.utils.logging.LOG_LEVEL_SILENT)

# mime type -> the container's name in messages
_CONTAINERS: Final = dict(zip(VIDEO_MIME_TYPES, ("MP4", "WebM", "AVI"), strict=True))


def sniff_video(data: bytes) -> str | None:
    """The mime type the bytes start like, among the supported containers."""
    if data[4:8] == b"ftyp":  # ISO base media (MP4, and QuickTime's MOV)
        return "video/mp4"
    if data.startswith(b"\x1a\x45\xdf\xa3"):  # EBML: WebM (and Matroska, which FFmpeg reads alike)
        return "video/webm"
    if data[:4] == b"RIFF" and data[8:12] == b"AVI ":
        return "video/x-msvideo"
    return None


@final
@dataclass(frozen=True, slots=True)
class VideoLimits:
    """What one clip may cost; the header's claims are checked against the first two before any
    frame is decoded."""

    max_frame_pixels: int  # width x height of one frame
    max_seconds: float  # the clip's duration: frame count / fps
    max_frames: int  # sampled frames handed on, at most
    decode_seconds: float  # wall time the decode may take

    def __post_init__(self) -> None:
        # `not > 0` rather than `<= 0`: NaN is refused too
        limits = (self.max_frame_pixels, self.max_seconds, self.max_frames, self.decode_seconds)
        if not all(limit > 0 for limit in limits):
            raise ValueError(f"video limits must all be positive: {self}")


# eq=False: the frames are an array, and dataclass equality on it would be ambiguous (numpy
# refuses to make one bool of an element-wise comparison)
@final
@dataclass(frozen=True, slots=True, eq=False)
class VideoFrames:
    """A clip's sampled frames, RGB, with what its header said about the clip."""

    frames: npt.NDArray[np.uint8]  # (n, height, width, 3), C-contiguous
    source_frames: int
    source_fps: float
    indices: tuple[int, ...]  # the source frame of each sampled frame

    @property
    def nbytes(self) -> int:
        return int(self.frames.nbytes)

    @property
    def duration(self) -> float:
        return self.source_frames / self.source_fps


def sample_indices(
    total_frames: int, duration: float, sampling: VideoSampling, max_frames: int
) -> list[int]:
    """The source frames to hand on: vLLM's uniform rule (``VideoBackend.
    compute_frames_index_to_sample``), with ``num_frames`` 0 meaning, and any larger value
    capped at, ``max_frames``. Sorted and distinct."""
    wanted = min(sampling.num_frames, max_frames) if sampling.num_frames > 0 else max_frames
    count = min(wanted, total_frames)
    if sampling.fps > 0:
        count = min(count, math.floor(duration * sampling.fps))
    count = max(1, count)
    if count == total_frames:
        return list(range(total_frames))
    return [int(i) for i in np.linspace(0, total_frames - 1, count, dtype=int)]


@final
@dataclass(frozen=True, slots=True)
class _Header:
    width: int
    height: int
    frames: int
    fps: float

    @property
    def duration(self) -> float:
        return self.frames / self.fps


def decode_video(
    data: bytes,
    mime_type: str,
    sampling: VideoSampling,
    limits: VideoLimits,
    *,
    stop: threading.Event | None = None,
) -> VideoFrames:
    """Decode the frames ``sampling`` picks, refusing what breaks ``limits`` as early as it shows.

    Raises:
        VideoRejected: not a supported container, not what ``mime_type`` says, corrupt,
            truncated, or beyond a limit; the message says which, in mmgate's words.
        DecodeStopped: ``stop`` was set (it is checked before each frame).
    """
    sniffed = sniff_video(data)
    if sniffed is None:
        raise VideoRejected("not an MP4, WebM or AVI video")
    if mime_type and mime_type != sniffed:
        raise VideoRejected(f"mime_type says {mime_type[:64]}, the bytes are {sniffed}")
    container = _CONTAINERS[sniffed]
    checkpoint = _Checkpoint(time.monotonic() + limits.decode_seconds, limits.decode_seconds, stop)
    checkpoint.check(0)
    backend = _stream_backend()
    # Held until after release(): release() segfaults where the capture holds the only reference
    # to its stream (seen with OpenCV 5.1, after reading to the end and even before reading at
    # all: it lets the stream go before FFmpeg's last use of it). vLLM's
    # `VideoCapture(BytesIO(data), ...)` holds none, and never calls release().
    stream = io.BytesIO(data)
    capture = cv2.VideoCapture()  # opened inside the try: open() may raise cv2.error too
    try:
        # OpenCV's binding takes any object with read() and seek(); its stub names its own class
        if not capture.open(cast("cv2.IStreamReader", stream), backend, []):
            raise VideoRejected(f"corrupt {container} video: it cannot be opened")
        header = _read_header(capture, container, limits)
        indices = sample_indices(header.frames, header.duration, sampling, limits.max_frames)
        frames = _read_frames(capture, indices, header, container, checkpoint)
    except cv2.error:
        # OpenCV's message names its source files and their lines: none of the client's business
        raise VideoRejected(f"corrupt {container} video: it cannot be decoded") from None
    finally:
        capture.release()
        del stream
    return VideoFrames(frames, header.frames, header.fps, tuple(indices))


@final
@dataclass(frozen=True, slots=True)
class _Checkpoint:
    """The checks made before each frame: the caller still waits, and the time is not up."""

    at: float
    seconds: float
    stop: threading.Event | None

    def check(self, frame: int) -> None:
        if self.stop is not None and self.stop.is_set():
            raise DecodeStopped(f"the decode was stopped at frame {frame}: its caller has gone")
        if time.monotonic() > self.at:
            raise VideoRejected(
                f"decoding took longer than {self.seconds:g} s, the limit (stopped at frame "
                f"{frame})"
            )


def _stream_backend() -> int:
    """FFmpeg, the one OpenCV backend that reads a video from memory (vLLM picks the first such
    backend; on OpenCV's wheels that is FFmpeg, and mmgate's guards above are FFmpeg's)."""
    if cv2.CAP_FFMPEG not in cv2.videoio_registry.getStreamBufferedBackends():
        raise RuntimeError("this OpenCV has no FFmpeg backend that reads video from memory")
    return cv2.CAP_FFMPEG


def _read_header(capture: cv2.VideoCapture, container: str, limits: VideoLimits) -> _Header:
    """The header's claims, refused before any frame is decoded where they break the limits."""
    # get() answers a double, NaN or negative where the header says nothing sensible
    width = capture.get(cv2.CAP_PROP_FRAME_WIDTH)
    height = capture.get(cv2.CAP_PROP_FRAME_HEIGHT)
    if not (math.isfinite(width * height) and width >= 1 and height >= 1):
        raise VideoRejected(f"corrupt {container} video: its header gives no frame size")
    pixels = int(width) * int(height)
    if pixels > limits.max_frame_pixels:
        raise VideoRejected(
            f"{int(width)}x{int(height)} = {pixels} pixels a frame; "
            f"the limit is {limits.max_frame_pixels}"
        )
    frames = capture.get(cv2.CAP_PROP_FRAME_COUNT)
    if not (math.isfinite(frames) and frames >= 1):
        raise VideoRejected(f"{container} video with no frames: its header counts none")
    fps = capture.get(cv2.CAP_PROP_FPS)
    if not (math.isfinite(fps) and fps > 0):
        raise VideoRejected(f"corrupt {container} video: its header gives no frame rate")
    header = _Header(int(width), int(height), int(frames), fps)
    if header.duration > limits.max_seconds:
        raise VideoRejected(
            f"{header.duration:.1f} s of video ({header.frames} frames at {fps:g} fps); "
            f"the limit is {limits.max_seconds:g} s"
        )
    return header


def _read_frames(
    capture: cv2.VideoCapture,
    indices: list[int],
    header: _Header,
    container: str,
    checkpoint: _Checkpoint,
) -> npt.NDArray[np.uint8]:
    """grab() every frame up to the last sampled one (grab decodes; there is no skipping ahead
    without a seek, and seeks are inexact), retrieve() and convert only the sampled ones."""
    frames = np.empty((len(indices), header.height, header.width, 3), dtype=np.uint8)
    position = 0  # the next frame grab() reads
    for slot, index in enumerate(indices):
        while position <= index:
            checkpoint.check(position)
            if not capture.grab():
                raise VideoRejected(
                    f"truncated {container} video: frame {position} cannot be read; only "
                    f"{position} of the {header.frames} frames its header declares could be read"
                )
            position += 1
        ok, frame = capture.retrieve()
        if not ok or frame is None:
            raise VideoRejected(f"corrupt {container} video: frame {index} cannot be decoded")
        # the array was sized from the header, and cvtColor given a dst of another shape would
        # quietly write into a new array instead (OpenCV 5.1 was seen to scale an MJPEG frame
        # whose own size changed mid-clip back to the first size; nothing promises it)
        if frame.shape != (header.height, header.width, 3):
            height, width = frame.shape[:2]
            raise VideoRejected(
                f"corrupt {container} video: frame {index} is {width}x{height}, "
                f"its header says {header.width}x{header.height}"
            )
        # in place: no second copy of each frame
        cv2.cvtColor(frame, cv2.COLOR_BGR2RGB, dst=frames[slot])
    return frames


__all__ = [
    "VideoFrames",
    "VideoLimits",
    "decode_video",
    "sample_indices",
    "sniff_video",
]
