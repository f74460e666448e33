"""Time to first token for an image request, by where the image was cached, measured in one run.

    python -m bench.images [--requests N] [--size 1024x768]          (make bench-images)

The tiny LLaVA test model (services/tiny_llava.py), served by a real mmgate server in this
process over loopback gRPC, one request at a time (concurrency 1), greedy, 8 new tokens. Each
request carries one JPEG photo-like image of --size pixels (gradients and shapes, ~100 KB) and
its own question. Cases:
  (a) new        an image nobody has seen: mmgate decodes it; pixels mode: vLLM runs its
                 processor and vision encoder; embeddings mode: mmgate runs the encoder
  (b) vLLM only  pixels mode, an image vLLM has seen (its processor cache keys on the digest,
                 sent as multi_modal_uuids) but mmgate's cache has dropped (Cache.Invalidate):
                 mmgate decodes it again, vLLM reuses what it cached
  (c) mmgate     embeddings mode, an image whose encoder output mmgate holds; vLLM's own
                 multimodal, encoder and prefix caches are emptied before each request, so
                 only mmgate's cache helps: no decode, no processor, no encoder run
  (d) Redis      embeddings mode with a real redis-server as the second tier: an image whose
                 encoder output only Redis holds (this replica's memory copy dropped, as on a
                 replica that never saw it; vLLM's caches emptied): a round trip, a digest
                 check and a decode of the stored tensor instead of a decode and an encode
Pixels mode and embeddings mode are two servers, started one after the other (one engine at a
time). Prompts are short, so vLLM's prefix cache (128-token blocks on CPU) reuses no block in any
case. Printed: p50 and p99 TTFT per case, and the ratios (a)/(c), (b)/(c), (a)/(b), (a')/(d),
(d)/(c).
Goal: (c) at least 2x faster than (a) at p50.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from PIL import Image, ImageDraw

from services.api.server import MmgateServer
from services.client import HeldImages, MmgateClient, build_request, digest_of
from services.config import Settings
from services.models import build_tiny_llava, engine_settings

from .service import percentile

MAX_TOKENS = 8
ENV = {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "VLLM_LOGGING_LEVEL": "WARNING"}


def photo(seed: int, size: tuple[int, int]) -> bytes:
    """A JPEG that compresses like a photo: smooth gradients and a few solid shapes."""
    rng = random.Random(seed)
    width, height = size
    base = Image.linear_gradient("L").resize(size).convert("RGB")
    tint = Image.new("RGB", size, tuple(rng.randrange(256) for _ in range(3)))
    image = Image.blend(base, tint, 0.5)
    draw = ImageDraw.Draw(image)
    for _ in range(12):
        x, y = rng.randrange(width), rng.randrange(height)
        r = rng.randrange(10, max(11, width // 6))
        colour = tuple(rng.randrange(256) for _ in range(3))
        draw.ellipse((x - r, y - r, x + r, y + r), fill=colour)
    out = io.BytesIO()
    image.save(out, format="JPEG", quality=90)
    return out.getvalue()


@dataclass
class Case:
    name: str
    ttft: list[float] = field(default_factory=list)
    outcomes: list[str] = field(default_factory=list)

    def ms(self, q: float) -> float:
        return percentile(self.ttft, q) * 1000


async def first_token(client: MmgateClient, image: bytes, question: int) -> tuple[float, str]:
    request = build_request(
        f"Question {question}: what is in this picture?",
        images=[image],
        max_tokens=MAX_TOKENS,
        temperature=0.0,
        ignore_eos=True,
    )
    started = time.perf_counter()
    ttft = 0.0
    outcome = ""
    async for event in client.generate(request):
        if event.HasField("delta") and not ttft:
            ttft = time.perf_counter() - started
        if event.HasField("final"):
            assert event.final.usage.completion_tokens == MAX_TOKENS
            outcome = event.final.cache.images[0].outcome
    return ttft, outcome


def settings(model: Path, mode: str, redis_url: str | None = None) -> Settings:
    return Settings(
        port=0,
        engine=engine_settings(model),
        metrics={"port": 0},
        media={"mode": mode},
        redis={"url": redis_url},
    )


def redis_server(directory: Path) -> tuple[subprocess.Popen[bytes], str]:
    """A redis-server of this run's own, on a free port, without persistence."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen(
        ["redis-server", "--port", str(port), "--save", "", "--appendonly", "no"],
        cwd=directory,
        stdout=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return process, f"redis://127.0.0.1:{port}/0"
        time.sleep(0.05)
    process.kill()
    raise TimeoutError("redis-server did not start")


async def serve(
    model: Path, mode: str, redis_url: str | None = None
) -> tuple[MmgateServer, MmgateClient]:
    server = MmgateServer(settings(model, mode, redis_url), model=str(model))
    await server.start()
    client = MmgateClient(f"127.0.0.1:{server.port}", timeout=120)
    # every image goes with its bytes: the cases, not the client, decide what is cached
    client.held = HeldImages(capacity=0)
    return server, client


async def measure(
    model: Path, images: Sequence[bytes], warmup: Sequence[bytes], redis_url: str
) -> list[Case]:
    new_pixels, vllm_only = Case("(a) new, pixels mode"), Case("(b) vLLM's cache only")
    new_embeddings, mmgate = Case("(a') new, embeddings mode"), Case("(c) mmgate's cache only")
    redis = Case("(d) Redis, another replica's")

    server, client = await serve(model, "pixels")
    try:
        for i, image in enumerate(warmup):
            await first_token(client, image, 10_000 + i)
        for i, image in enumerate(images):
            ttft, outcome = await first_token(client, image, i)
            new_pixels.ttft.append(ttft)
            new_pixels.outcomes.append(outcome)
        for i, image in enumerate(images):
            await client.invalidate(digest=digest_of(image))
            ttft, outcome = await first_token(client, image, 1_000 + i)
            vllm_only.ttft.append(ttft)
            vllm_only.outcomes.append(outcome)
    finally:
        await client.close()
        await server.stop(grace=5)

    server, client = await serve(model, "embeddings", redis_url)
    try:
        for i, image in enumerate(warmup):
            await first_token(client, image, 10_000 + i)
        for i, image in enumerate(images):
            ttft, outcome = await first_token(client, image, 2_000 + i)
            new_embeddings.ttft.append(ttft)
            new_embeddings.outcomes.append(outcome)
        for _ in range(600):  # the write-backs to Redis, at most 30 s
            if not server.cache.stats().tier_write_queue_depth:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.2)  # the last SET in flight
        for i, image in enumerate(images):
            # as on a replica that never saw the image: only Redis holds its encoder output
            for key in server.pipeline.media.stage_keys(digest_of(image)).values():
                await server.cache.invalidate(key, local=True)
            await server.engine.forget_media()
            ttft, outcome = await first_token(client, image, 4_000 + i)
            redis.ttft.append(ttft)
            redis.outcomes.append(outcome)
        for i, image in enumerate(images):
            await server.engine.forget_media()
            ttft, outcome = await first_token(client, image, 3_000 + i)
            mmgate.ttft.append(ttft)
            mmgate.outcomes.append(outcome)
    finally:
        await client.close()
        await server.stop(grace=5)
    return [new_pixels, vllm_only, new_embeddings, mmgate, redis]


def report(cases: Sequence[Case], size: tuple[int, int]) -> None:
    print(f"\nTTFT, one {size[0]}x{size[1]} JPEG per request, {len(cases[0].ttft)} requests a case")
    print(f"{'case':<28} {'p50 ms':>8} {'p99 ms':>8}  mmgate outcomes")
    for case in cases:
        outcomes = {o: case.outcomes.count(o) for o in sorted(set(case.outcomes))}
        print(f"{case.name:<28} {case.ms(0.5):8.2f} {case.ms(0.99):8.2f}  {outcomes}")
    a, b, a2, c, d = cases
    print("\nratios at p50 (above 1: the second is faster)")
    print(f"  (a) new / (c) mmgate's cache        {a.ms(0.5) / c.ms(0.5):6.2f}x   goal >= 2x")
    print(f"  (a') new, embeddings / (c)          {a2.ms(0.5) / c.ms(0.5):6.2f}x")
    print(f"  (b) vLLM's cache / (c)              {b.ms(0.5) / c.ms(0.5):6.2f}x")
    print(f"  (a) new / (b) vLLM's cache          {a.ms(0.5) / b.ms(0.5):6.2f}x")
    print(f"  (a) pixels / (a') embeddings, new   {a.ms(0.5) / a2.ms(0.5):6.2f}x")
    print(f"  (a') new / (d) Redis                {a2.ms(0.5) / d.ms(0.5):6.2f}x")
    print(f"  (d) Redis / (c) mmgate's memory     {d.ms(0.5) / c.ms(0.5):6.2f}x")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=40, help="requests per case")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--size", default="1024x768", help="image size, WIDTHxHEIGHT")
    parser.add_argument("--model", type=Path, help="tiny LLaVA folder (built when absent)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    for name, value in ENV.items():
        os.environ.setdefault(name, value)
    width, height = (int(v) for v in args.size.split("x"))
    size = (width, height)
    images = [photo(seed, size) for seed in range(args.requests)]
    warmup = [photo(100_000 + seed, size) for seed in range(args.warmup)]
    print(f"images: {len(images[0]) // 1024} KiB JPEG each", file=sys.stderr)
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or build_tiny_llava(Path(tmp) / "tiny-llava")
        redis, url = redis_server(Path(tmp))
        try:
            cases = asyncio.run(measure(model, images, warmup, url))
        finally:
            redis.terminate()
            redis.wait(timeout=30)
    report(cases, size)


if __name__ == "__main__":
    main()
