"""Repeated video clips: mmgate against vLLM's own server, by repeats, layout and working set.

    python -m bench.video_repeats [--model tiny|big] [--requests 30] [--repeats 0 0.5 0.9]
                                  [--working-sets 4]
                                  [--layouts shared per-request]
                                  [--contenders mmgate vllm-base64 vllm-uuid ...] [--json F]
                                  [--runs 3] [--servers 2] [--interleave [--block 1]]
                                  [--pin CPU]

bench/image_repeats.py with clips for images: its cases, request plan, schedule, freezing of the
idle engines, pinning, ratios and run agreement are imported from it, and what is said there of
them holds here. The model (--model) is the tiny video model (a random Qwen2-VL,
services/models/tiny_video.py), whose tower costs nothing, or ``big``: the same language model
behind a tower of Qwen2-VL-2B's shape (``build_qwen2vl_video``: 24 positions a clip, ~1.1 s of
tower a clip on one CPU). Each contender runs on a fresh engine with the same engine arguments
(``engine_settings(model)``: float32, the model's context) and the same limits (one image and
one clip a request), and samples the same frames of a clip (``FRAMES``, spread evenly):
  mmgate        ``mmgate serve`` with clips in pixels mode (``MMGATE_MEDIA__VIDEO_MODE``): a
                clip is decoded and sampled once per (tenant, digest, sampling), its frames
                cached and handed to vLLM with a uuid; the engine encodes them. Called by
                ``MmgateClient`` with ``Video(data=..., num_frames=FRAMES)``: the client sends a
                clip's bytes every time (it sends a held image by digest, not yet a held clip)
  mmgate-embeddings, mmgate-auto
                the same in embeddings mode (mmgate runs the video tower once a clip and caches
                its output; vLLM takes it as video_embeds) and in auto mode (one of the two, by
                the tower's speed, chosen at start)
  vllm-base64   ``vllm.entrypoints.openai.api_server`` with ``--media-io-kwargs`` set to the same
                frame count, streaming chat completions with the clip as a base64 data URL
                (``video_url``, ``video/x-msvideo``), vLLM's own caches on
  vllm-uuid     the same with a per-item ``uuid`` beside the data URL. vLLM still decodes the
                clip on every request: its chat parser fetches a ``video_url`` whatever its uuid
                (vllm/renderers/chat_utils.py); the uuid only names the item for its processor
                and encoder caches, which without it key on a hash of the item

Each case (layout, working set W, repeat ratio R): W clips sent once first (unmeasured), then
--requests requests one at a time, each with a new clip (share 1-R) or one of the W (share R,
seeded: the same sequence for every contender), then bursts of 8 requests sent together, each
burst with a new clip. Clips: ``CLIP_FRAMES`` frames of ``CLIP_SIZE`` at ``CLIP_FPS`` (4 s),
moving shapes in MJPG in AVI (tests/video_clips.py, ~100 KB), each made before its case's clock
starts; greedy, 8 new tokens. Before the cases each side answers
the same warm-up clips, and the sides are printed grouped by the tokens they gave.

Printed per case and contender: TTFT p50/p99, requests/s, bytes sent per request, and what each
side counts: mmgate its video decodes, their seconds, the frames sampled and its video tower's
runs (Cache.GetStats' VideoStats, before and after); vLLM its processor-cache queries and hits and
prefix-cache hits (``vllm:mm_cache_*``, ``vllm:prefix_cache_*``): vLLM exports no count of video
decodes or encoder runs.
Then, as image_repeats does, vLLM's TTFT p50 / mmgate's and mmgate's req/s / vLLM's.

vLLM's encoder cache (vllm/v1/core/encoder_cache_manager.py, ``compute_encoder_budget``) holds
``max(max_num_batched_tokens, one item's most tokens)`` tokens of tower output; on a CPU vLLM
defaults ``max_num_batched_tokens`` to 2048 (``get_batch_defaults``), capped at ``max_num_seqs
* max_model_len``. The big model runs with ``BIG_ENGINE`` on both sides (``max_num_seqs`` 4,
context 128): a cache of 512 tokens, 21 clips of 24 positions (320x240 resized to 84x56), so
that a working set past it takes minutes to send rather than a quarter of an hour; its size is
printed at start, from the scheduler config each side's engine gets (vLLM's server and mmgate's
engine default it apart). Only the per-request layout measures that cache: in the shared one a
repeated clip's positions are prefix-cache hits, which spare vLLM the tower whatever its encoder
cache holds.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from services.client import build_request
from services.config import EngineSettings, default_model_cache
from services.engine.plan import EnginePlan, ImageIntake
from services.engine.worker import EngineWorker
from services.models.tiny_video import (
    build_qwen2vl_video,
    build_tiny_video,
    engine_settings,
)
from services.proto.mmgate.v1 import inference_pb2 as pb
from services.wire import VIDEO_PLACEHOLDER
from tests.video_clips import moving_shapes

from .image_repeats import (
    BURST,
    SYSTEM,
    Case,
    Freezer,
    MmgateSide,
    Pooled,
    Servers,
    VllmSide,
    add_run_options,
    measured_runs,
    prepare,
    run_case,
)
from .openai_server import tree_rss_bytes

MAX_TOKENS: Final = 8
FRAMES: Final = 8  # sampled from each clip, by both sides
CLIP_FRAMES: Final = 64
CLIP_SIZE: Final = (320, 240)
CLIP_FPS: Final = 16.0
MIME_TYPE: Final = "video/x-msvideo"  # AVI: what write_clip makes of MJPG frames
# the big model's engine arguments beyond engine_settings', the same for every side: a small
# encoder cache (max_num_seqs * max_model_len = 512 tokens), see the module's docstring; a
# per-request prompt (~80 positions with its clip and answer) fits, the shared system prompt not
BIG_ENGINE: Final = {"max_num_seqs": 4, "max_model_len": 128}


def clip(seed: int) -> bytes:
    return moving_shapes(CLIP_FRAMES, CLIP_SIZE, CLIP_FPS, seed, "avi")


class Clips(dict[int, bytes]):
    """Clips by seed, each made on first use: ``run_case``'s ``images``, which makes a photo for
    a seed it does not hold; here every seed is held, as a clip."""

    def __contains__(self, seed: object) -> bool:
        return True

    def __missing__(self, seed: int) -> bytes:
        made = self[seed] = clip(seed)
        return made


def question(n: int) -> str:
    return f"Question {n}: what happens in this clip?"


def intro(n: int) -> str:
    return f"Request {n} from the archive, file {n * 7919 % 10007}: "


class MmgateVideoSide(MmgateSide):
    """mmgate with clips in ``video_mode`` (images in pixels mode: this model has no image
    encoder of mmgate's), limited to one image and one clip a request as vLLM's server is."""

    def __init__(self, model: Path, engine: dict[str, Any], video_mode: str = "pixels") -> None:
        super().__init__(model, engine, mode="pixels")
        self.name = "mmgate" if video_mode == "pixels" else f"mmgate-{video_mode}"
        self.server.env.update(
            {
                "MMGATE_MEDIA__VIDEO_MODE": video_mode,
                "MMGATE_MEDIA__MAX_IMAGES_PER_REQUEST": "1",
                "MMGATE_MEDIA__MAX_VIDEOS_PER_REQUEST": "1",
            }
        )
        self.tokens: tuple[int, ...] = ()  # the last answer's

    async def ask(self, image: bytes, layout: str, n: int) -> tuple[float, int]:
        client = self.server.client
        video = pb.Video(data=image, num_frames=FRAMES)
        if layout == "shared":
            request = build_request(
                f"{VIDEO_PLACEHOLDER}\n{question(n)}",
                messages=[("system", SYSTEM)],
                videos=[video],
                max_tokens=MAX_TOKENS,
                temperature=0.0,
                ignore_eos=True,
            )
        else:
            request = build_request(
                f"{intro(n)}{VIDEO_PLACEHOLDER}\n{question(n)}",
                videos=[video],
                max_tokens=MAX_TOKENS,
                temperature=0.0,
                ignore_eos=True,
            )
        # what the client sends: by_reference swaps held images for digests (clips: none yet)
        sent = (client.held.by_reference(request) or request).ByteSize()
        started = time.perf_counter()
        ttft = 0.0
        tokens: list[int] = []
        async for event in client.generate(request):
            if event.HasField("delta"):
                if not ttft:
                    ttft = time.perf_counter() - started
                tokens.extend(event.delta.token_ids)
            if event.HasField("final"):
                assert event.final.usage.completion_tokens == MAX_TOKENS
        self.tokens = tuple(tokens)
        return ttft, sent

    async def counts(self) -> dict[str, float]:
        """The server's own count of its video work (Cache.GetStats' VideoStats)."""
        video = (await self.server.client.stats()).video
        return {
            "video decodes": float(video.decodes),
            "decode s": video.decode_seconds,
            "frames sampled": float(video.frames),
            "tower runs": float(video.encodes),
        }


class VllmVideoSide(VllmSide):
    """vLLM's OpenAI server with mmgate's engine arguments for one image and one clip a request,
    sampling ``FRAMES`` frames of a clip (``--media-io-kwargs``)."""

    def __init__(self, model: Path, engine: dict[str, Any], *, uuids: bool) -> None:
        super().__init__(model, engine, uuids=uuids)
        intake = ImageIntake(per_prompt=1, embeddings=False, videos=1)
        args = EngineWorker(EngineSettings(**engine)).engine_args(EnginePlan(str(model), intake))
        # the server's default for every request (per-request media_io_kwargs are off by default)
        args.media_io_kwargs = {"video": {"num_frames": FRAMES}}
        self.server.args = args
        self.tokens: tuple[int, ...] = ()

    async def ask(self, image: bytes, layout: str, n: int) -> tuple[float, int]:
        part: dict[str, Any] = {
            "type": "video_url",
            "video_url": {"url": f"data:{MIME_TYPE};base64," + base64.b64encode(image).decode()},
        }
        if self.uuids:
            part["uuid"] = hashlib.sha256(image).hexdigest()
        # the text parts mmgate's "<video>" splits its prompt into: the same rendered prompt
        text = {"type": "text", "text": "\n" + question(n)}
        if layout == "shared":
            content = [part, text]
            system: str | None = SYSTEM
        else:
            content = [{"type": "text", "text": intro(n)}, part, text]
            system = None
        ttft, tokens, sent = await self.server.chat(content, max_tokens=MAX_TOKENS, system=system)
        assert len(tokens) == MAX_TOKENS, tokens
        self.tokens = tokens
        return ttft, sent


VideoSide = MmgateVideoSide | VllmVideoSide


def encoder_cache_tokens(model: Path, engine: dict[str, Any]) -> dict[str, int] | None:
    """vLLM's encoder cache size in tokens, as vLLM's server and mmgate's engine would size it
    for these engine arguments (their usage contexts default ``max_num_batched_tokens`` apart),
    and the positions one clip of the benchmark takes."""
    try:
        import numpy as np
        from transformers import AutoProcessor
        from vllm.usage.usage_lib import UsageContext

        intake = ImageIntake(per_prompt=1, embeddings=False, videos=1)
        args = EngineWorker(EngineSettings(**engine)).engine_args(EnginePlan(str(model), intake))
        sizes = {}
        for name, usage in (
            ("vllm-server", UsageContext.OPENAI_API_SERVER),
            ("mmgate-engine", UsageContext.ENGINE_CONTEXT),
        ):
            config = args.__class__(**vars(args)).create_engine_config(usage_context=usage)
            sizes[name] = int(config.scheduler_config.encoder_cache_size)
        processor = AutoProcessor.from_pretrained(model)
        width, height = CLIP_SIZE
        frames = np.zeros((FRAMES, height, width, 3), dtype=np.uint8)
        grid = processor.video_processor(videos=[frames], return_tensors="np")["video_grid_thw"]
        t, h, w = (int(v) for v in grid[0])
        sizes["clip"] = t * h * w // 4  # the merger's 2x2
        return sizes
    except Exception as error:  # noqa: BLE001 - a vLLM without that field: say so, measure anyway
        print(f"vLLM's encoder cache size unknown here: {error}", file=sys.stderr)
        return None


def make_side(name: str, model: Path, engine: dict[str, Any]) -> VideoSide:
    if name == "mmgate":
        return MmgateVideoSide(model, engine)
    if name.startswith("mmgate-"):
        return MmgateVideoSide(model, engine, video_mode=name.removeprefix("mmgate-"))
    return VllmVideoSide(model, engine, uuids=name == "vllm-uuid")


def agreement_of(answers: dict[str, list[tuple[int, ...]]]) -> str:
    """Which sides gave the same tokens for the same clips: "the same tokens from a, b", or each
    group of sides that agree with its first clip's answer."""
    groups: dict[tuple[tuple[int, ...], ...], list[str]] = {}
    for name, tokens in answers.items():
        groups.setdefault(tuple(tokens), []).append(name)
    if len(groups) == 1:
        return f"the same tokens from {', '.join(answers)}"
    return "different tokens: " + "; ".join(
        f"{', '.join(names)} {list(tokens[0])}" for tokens, names in groups.items()
    )


def shown(counts: dict[str, float]) -> str:
    return ", ".join(f"{name} {value:.3g}" for name, value in counts.items())


async def run_sides(
    names: Sequence[str],
    model: Path,
    engine: dict[str, Any],
    cases: list[Case],
    args: argparse.Namespace,
    clips: Clips,
    pooled: Pooled,
    servers: dict[str, list[dict[str, float]]],
) -> None:
    """image_repeats.run_sides with clips: contenders on fresh servers, started together and
    measured case by case; each side's figures pooled with its earlier servers' in the run."""
    sides = [make_side(name, model, engine) for name in names]
    freezer = Freezer()
    warm_tokens: dict[str, list[tuple[int, ...]]] = {}
    try:
        for side in sides:
            start_s = await side.start()
            print(f"{side.name}: serving in {start_s:.1f} s", flush=True)
            servers.setdefault(side.name, []).append({"start_s": start_s})
            freezer.add(side)
            for warm in range(3):  # the engine's and the client's first requests
                await side.ask(clips[900_000 + warm], "per-request", -100 - warm)
                warm_tokens.setdefault(side.name, []).append(side.tokens)
        print(f"warm-up clips: {agreement_of(warm_tokens)}", flush=True)
        for k, case in enumerate(cases):
            measured = await run_case(
                sides, case, args.requests, 1_000 + 100_000 * k, clips, args.block, freezer
            )
            for name, (figures, burst) in measured.items():
                summary = figures.summary()
                print(
                    f"  {name:<17} {case.label:<34} TTFT p50 {figures.ms(0.5):8.1f} ms "
                    f"p99 {figures.ms(0.99):8.1f} ms  {summary['requests_per_s']:6.2f} req/s  "
                    f"{summary['bytes_per_request']:8.0f} B/req  {shown(figures.counts)}  "
                    f"| bursts of {BURST}: p50 {' '.join(f'{ms:.0f}' for ms in burst.each)} "
                    f"ms; {shown(burst.counts)}",
                    flush=True,
                )
                if name in pooled.setdefault(case.label, {}):
                    pooled[case.label][name][0].add(figures)
                    pooled[case.label][name][1].add(burst)
                else:
                    pooled[case.label][name] = (figures, burst)
        for side in sides:
            servers[side.name][-1]["rss_bytes"] = tree_rss_bytes(side.server.pid)
    finally:
        freezer.thaw()
        for side in sides:
            await side.close()


async def main(args: argparse.Namespace) -> None:
    prepare(args)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        if args.model_path is not None:
            model = args.model_path
        elif args.model == "big":
            # 2.6 GB: built once beside the converted models, not again for every run
            model = build_qwen2vl_video(default_model_cache() / "qwen2vl-video")
        else:
            model = build_tiny_video(Path(tmp) / "tiny-video")
        engine = engine_settings(model)
        if args.model == "big":
            engine.update(BIG_ENGINE)
        width, height = CLIP_SIZE
        print(
            f"model {args.model} ({model}); clips: {CLIP_FRAMES} frames of {width}x{height} at "
            f"{CLIP_FPS:g} fps, MJPG in AVI, ~{len(clip(0)) // 1024} KiB; {FRAMES} sampled"
        )
        cache = encoder_cache_tokens(model, engine)
        if cache is not None:
            per_clip = cache.pop("clip")
            print(
                f"vLLM's encoder cache: {shown({k: float(v) for k, v in cache.items()})} tokens;"
                f" a clip takes {per_clip}: {min(cache.values()) // per_clip} clips held; "
                f"working sets {args.working_sets}"
            )
        cases = [
            Case(layout, w, r)
            for layout in args.layouts
            for w in args.working_sets
            for r in args.repeats
        ]
        clips = Clips()

        async def sides(order: list[str], pooled: Pooled, servers: Servers) -> None:
            await run_sides(order, model, engine, cases, args, clips, pooled, servers)

        runs = await measured_runs(args, sides)
    print(f"\nwhole run: {time.perf_counter() - started:.0f} s")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        about = {
            "model": "tiny-video" if args.model == "tiny" else "qwen2vl-video",
            "encoder_cache_tokens": cache,
            "requests": args.requests,
            "clip": {"frames": CLIP_FRAMES, "size": CLIP_SIZE, "fps": CLIP_FPS, "codec": "MJPG"},
            "frames_sampled": FRAMES,
            "runs": args.runs,
            "servers_per_run": args.servers,
            "interleaved": args.interleave,
        }
        # "results": the first run, "runs": every one (image_repeats' layout)
        document = {"about": about, "results": runs[0], "runs": runs}
        args.json.write_text(json.dumps(document, indent=1))
        print(f"figures written to {args.json}")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--model", choices=["tiny", "big"], default="tiny")
    parser.add_argument("--model-path", type=Path, default=None, help="a video model built")
    parser.add_argument("--requests", type=int, default=30)
    parser.add_argument("--repeats", type=float, nargs="+", default=[0.0, 0.5, 0.9])
    parser.add_argument("--working-sets", type=int, nargs="+", default=[4])
    parser.add_argument(
        "--layouts", nargs="+", choices=["shared", "per-request"], default=["shared", "per-request"]
    )
    parser.add_argument(
        "--contenders",
        nargs="+",
        choices=["mmgate", "mmgate-embeddings", "mmgate-auto", "vllm-base64", "vllm-uuid"],
        default=["mmgate", "vllm-base64", "vllm-uuid"],
    )
    add_run_options(parser)
    args = parser.parse_args(argv)
    if args.model == "big" and "shared" in args.layouts:
        parser.error("--model big: the shared layout's system prompt exceeds BIG_ENGINE's context")
    return args


__all__ = ["Clips", "MmgateVideoSide", "VllmVideoSide", "main", "parse_args"]


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
