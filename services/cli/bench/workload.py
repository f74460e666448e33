"""What ``mmgate bench`` sends: a reproducible stream of requests from a few knobs.

    seed ─▶ for request i: burst? (every ``burst_every``: ``burst_size`` identical deterministic
            requests at once) ─▶ image? (``image_ratio``) ─▶ repeat one of the working set
            (``image_repeat``) or a new image ─▶ a prompt of its own ─▶ GenerateRequest

Images are made here (Pillow), each distinct one once, so a repeat sends the same bytes (the
client then sends its digest, as any mmgate client does once the server has it).
"""

from __future__ import annotations

import dataclasses
import io
import random
from dataclasses import dataclass
from typing import final

from PIL import Image

from ...client import build_request
from ...proto.mmgate.v1 import inference_pb2


@final
@dataclass(frozen=True, slots=True)
class Mix:
    max_tokens: int = 32
    prompt_words: int = 12
    temperature: float = 0.0
    cache_policy: str = "prompt"
    stream_interval: int | None = None  # tokens per streamed message; None: the server's
    image_ratio: float = 0.0  # share of requests that carry an image
    image_repeat: float = 0.5  # share of image requests that reuse one of the working set
    working_set: int = 16  # distinct images requests reuse
    image_size: tuple[int, int] = (64, 48)
    burst_every: int = 0  # 0: no bursts; else after this many requests, one burst
    burst_size: int = 8  # identical requests in a burst
    # the client misbehaving on purpose (chaos runs): cancelled at a random moment within
    # cancel_within seconds, or sent with a deadline of at most short_deadline seconds
    cancel_ratio: float = 0.0
    cancel_within: float = 1.0
    short_deadline_ratio: float = 0.0
    short_deadline: float = 0.05
    seed: int = 0


@final
@dataclass(frozen=True, slots=True)
class Planned:
    """One request to send, with what it is (for the report)."""

    index: int
    request: inference_pb2.GenerateRequest
    kind: str  # "text", "image", "burst"
    cancel_after: float | None = None  # the client cancels the call this long after sending
    timeout: float | None = None  # a deadline of its own, else the run's


WORDS = (
    "river",
    "stone",
    "cloud",
    "lantern",
    "copper",
    "meadow",
    "signal",
    "harbor",
    "quiet",
    "amber",
    "orbit",
    "ferry",
    "garden",
    "thunder",
    "pencil",
    "violet",
    "marble",
    "canyon",
    "whistle",
    "ember",
)


@final
class Workload:
    def __init__(self, mix: Mix) -> None:
        self.mix = mix
        self._rng = random.Random(mix.seed)
        # the client's misbehaviour draws apart: turning it on does not change the requests
        self._client_rng = random.Random(f"{mix.seed}-client")
        self._images: list[bytes] = []  # the working set, made as first needed
        self._made = 0
        self._next = 0
        self._burst_left = 0
        self._burst: inference_pb2.GenerateRequest | None = None

    def next(self) -> Planned:
        planned = self._request()
        mix, rng = self.mix, self._client_rng
        roll = rng.random()
        if roll < mix.cancel_ratio:
            return dataclasses.replace(planned, cancel_after=rng.uniform(0, mix.cancel_within))
        if roll < mix.cancel_ratio + mix.short_deadline_ratio:
            return dataclasses.replace(planned, timeout=rng.uniform(0.001, mix.short_deadline))
        return planned

    def _request(self) -> Planned:
        index, self._next = self._next, self._next + 1
        mix = self.mix
        if self._burst_left == 0 and mix.burst_every and index and index % mix.burst_every == 0:
            self._burst_left = mix.burst_size
            self._burst = build_request(
                self._prompt(index),
                max_tokens=mix.max_tokens,
                temperature=0.0,
                cache_policy="response",
                stream_interval=mix.stream_interval,
            )
        if self._burst_left and self._burst is not None:
            self._burst_left -= 1
            return Planned(index, self._burst, "burst")
        images: list[bytes] = []
        if self._rng.random() < mix.image_ratio:
            images.append(self._image())
        request = build_request(
            self._prompt(index),  # an image's placeholder is put before it
            images=images,
            max_tokens=mix.max_tokens,
            temperature=mix.temperature,
            cache_policy=mix.cache_policy,
            stream_interval=mix.stream_interval,
        )
        return Planned(index, request, "image" if images else "text")

    def _prompt(self, index: int) -> str:
        words = " ".join(self._rng.choice(WORDS) for _ in range(self.mix.prompt_words))
        return f"Request {index}: write about {words}."

    def _image(self) -> bytes:
        mix = self.mix
        if self._images and self._rng.random() < mix.image_repeat:
            return self._rng.choice(self._images)
        data = self._make_image(self._made)
        self._made += 1
        if len(self._images) < mix.working_set:
            self._images.append(data)
        else:
            self._images[self._rng.randrange(mix.working_set)] = data
        return data

    def _make_image(self, number: int) -> bytes:
        width, height = self.mix.image_size
        rng = random.Random(f"{self.mix.seed}-{number}")
        image = Image.frombytes("RGB", (width, height), rng.randbytes(width * height * 3))
        out = io.BytesIO()
        image.save(out, format="PNG")
        return out.getvalue()


__all__ = ["Mix", "Planned", "Workload"]
