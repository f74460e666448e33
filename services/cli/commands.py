"""The ``mmgate`` command.

mmgate serve [--port 50051 --engine.model PATH ...]   settings: env MMGATE_*, flags override
mmgate generate "What is the capital of France?" [--stream] [--max-tokens N] [--raw]
mmgate generate "What is in the picture?" --image photo.jpg   (a vision model)
mmgate generate "What is in the picture?" --image-url https://cdn.example.com/photo.jpg
mmgate generate "What happens in the clip?" --video clip.mp4 --frames 16   (a video model)
mmgate generate "Summarise the ticket" --adapter support    (a LoRA adapter the caller may use)
mmgate generate "Tag this" --priority 10                      (lower is more urgent)
mmgate generate "Weather in Oslo?" --tool weather.json --tool-choice required  (tool calls)
mmgate stats [--target HOST:PORT] [--watch [SECONDS] [--count N]]
mmgate cache watch [--stage S] [--of TENANT | --all-tenants] [--since SEQ] [--count N | --snapshot]
mmgate bench [--concurrency N | --rate R] (--requests N | --duration S) [--json F] [--plot F]
mmgate models prepare [--cache DIR]
mmgate models tiny PATH [--seed N]          a tiny random Llama (tests)
mmgate models tiny-llava PATH [--seed N]    a tiny random LLaVA (multimodal tests)
mmgate models tiny-video PATH [--seed N]    a tiny random Qwen2-VL (video tests)
mmgate models vitl-llava PATH [--seed N]    a random LLaVA, ViT-L/14-336-sized tower (benchmarks)
mmgate models qwen2vl-video PATH [--seed N] a random Qwen2-VL, 2B-sized video tower (benchmarks)
mmgate models adapter MODEL PATH [--seed N] [--rank R] [--vision]   a random LoRA adapter (tests)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import faulthandler
import json
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc

from ..client import DEFAULT_TARGET, MmgateClient
from ..proto.mmgate.v1 import inference_pb2
from . import arguments, bench, cache_watch
from .stats_view import render_stats


def _serve(argv: Sequence[str]) -> int:
    from pydantic import ValidationError

    from ..api.server import serve
    from ..config import Settings
    from ..engine.reaper import spawn_reaper
    from ..observability.logs import configure_logging

    try:
        settings = Settings(_cli_parse_args=list(argv))
    except ValidationError as exc:
        # the field and the reason, without pydantic's traceback and URLs
        for error in exc.errors(include_url=False):
            field = ".".join(str(part) for part in error["loc"]) or "settings"
            sys.stderr.write(f"mmgate serve: {field}: {error['msg']}\n")
        return 2
    # each line carries the trace and span ids of the request it was logged in
    configure_logging(settings.log_level, settings.log_format)
    # a native crash is logged (the signal and every thread's stack) instead of dying silently,
    # and the reaper ends the engine's processes when this one dies without stopping them
    faulthandler.enable()
    reaper = spawn_reaper()
    try:
        asyncio.run(serve(settings))
    finally:
        reaper.kill()
        reaper.wait()
    return 0


async def _generate(args: argparse.Namespace) -> int:
    options = {
        "raw": args.raw,
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
        "seed": args.seed,
        "cache_policy": args.cache_policy,
        "images": [*args.image_bytes, *args.image_url],
        "videos": [
            inference_pb2.Video(**source, num_frames=args.frames or 0)
            for source in (
                *({"data": data} for data in args.video_bytes),
                *({"url": url} for url in args.video_url),
            )
        ],
        "json_schema": args.json_schema_text,
        "regex": args.regex,
        "choice": args.choice or None,
        "n": args.n if args.n != 1 else None,
        "logprobs": args.logprobs,
        "adapter": args.adapter or "",
        "priority": args.priority,
        "tools": args.tools,
        "tool_choice": args.tool_choice,
    }
    async with MmgateClient(
        args.target,
        tenant=args.tenant,
        credentials=arguments.credentials(args),
        timeout=args.timeout,
    ) as client:
        if args.stream:
            async for text in client.stream_text(args.prompt, **options):
                sys.stdout.write(text)
                sys.stdout.flush()
            sys.stdout.write("\n")
        else:
            response = await client.complete(args.prompt, **options)
            sys.stdout.write(_choices(response, several=args.n > 1))
    return 0


def _tools_in(path: Path) -> list[dict[str, Any]]:
    """The tools of a JSON file: one, or a list; each as mmgate's fields or OpenAI's form."""
    loaded = json.loads(path.read_text("utf-8"))
    tools = loaded if isinstance(loaded, list) else [loaded]
    return [tool.get("function", tool) if isinstance(tool, dict) else tool for tool in tools]


def _choices(response: inference_pb2.CompleteResponse, *, several: bool) -> str:
    """Each sample's text (numbered when several), each token's log-probability when asked."""
    lines: list[str] = []
    for choice in response.choices:
        lines.append(f"[{choice.index}] {choice.text}" if several else choice.text)
        for call in choice.end.tool_calls:
            lines.append(f"call {call.id} {call.name} {call.arguments}")
        if choice.end.tool_parse_error:
            lines.append(f"no call: {choice.end.tool_parse_error}")
        for position in choice.logprobs:
            top = "  ".join(f"{alt.text!r} {alt.logprob:.4f}" for alt in position.top)
            lines.append(f"  {position.token.text!r}\t{position.token.logprob:.4f}\t{top}")
    return "".join(line + "\n" for line in lines)


async def _stats(args: argparse.Namespace) -> int:
    if args.count is not None and args.watch is None:
        sys.stderr.write("mmgate stats: --count needs --watch\n")
        return 2
    async with MmgateClient(
        args.target, credentials=arguments.credentials(args), timeout=args.timeout
    ) as client:
        if args.watch is None:
            sys.stdout.write(render_stats(await client.stats()))
            return 0
        await _watch_stats(client, args.target, args.watch, args.count)
    return 0


async def _cache_watch(args: argparse.Namespace) -> int:
    async with MmgateClient(
        args.target, credentials=arguments.credentials(args), timeout=args.timeout
    ) as client:
        return await cache_watch.watch(client, args)


async def _watch_stats(
    client: MmgateClient, target: str, interval: float, count: int | None
) -> None:
    """Redraw the stats every ``interval`` seconds until Ctrl-C, or ``count`` tables."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGINT, stop.set)
    tty = sys.stdout.isatty()
    shown = 0
    try:
        while True:
            table = render_stats(await client.stats())  # bounded by the client's timeout
            heading = (
                f"mmgate stats {target}, every {interval:g} s, {time.strftime('%H:%M:%S')}\n\n"
            )
            # on a terminal: home the cursor and clear the screen; piped: tables one after another
            prefix = "\x1b[H\x1b[2J" if tty else ("\n" if shown else "")
            sys.stdout.write(prefix + heading + table)
            sys.stdout.flush()
            shown += 1
            if count is not None and shown >= count:
                return
            # the refresh interval, cut short by Ctrl-C
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval)
            if stop.is_set():
                return
    finally:
        loop.remove_signal_handler(signal.SIGINT)


def _models(args: argparse.Namespace) -> int:
    from .. import models

    if args.models_command == "tiny":
        path = models.build_tiny_model(Path(args.path), seed=args.seed)
    elif args.models_command == "tiny-llava":
        path = models.build_tiny_llava(Path(args.path), seed=args.seed)
    elif args.models_command == "tiny-video":
        path = models.build_tiny_video(Path(args.path), seed=args.seed)
    elif args.models_command == "vitl-llava":
        path = models.build_vitl_llava(Path(args.path), seed=args.seed)
    elif args.models_command == "qwen2vl-video":
        path = models.build_qwen2vl_video(Path(args.path), seed=args.seed)
    elif args.models_command == "adapter":
        path = models.build_test_adapter(
            Path(args.model), Path(args.path), seed=args.seed, rank=args.rank, vision=args.vision
        )
    else:
        from ..config import Settings

        cache = Path(args.cache) if args.cache else Settings().model_cache
        path = models.prepare_default_model(cache)
        # dtype=auto on this CPU, by evidence: a known-answer check in bfloat16 the first time
        from ..engine.dtypes import VERDICTS_FILE, Verdicts, settle_auto_dtype

        choice = settle_auto_dtype(str(path), Verdicts(cache / VERDICTS_FILE))
        sys.stderr.write(f"dtype=auto serves {choice.dtype} here: {choice.reason}\n")
    sys.stdout.write(f"{path}\n")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mmgate", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("serve", help="run the gRPC service (mmgate serve --help)", add_help=False)

    generate = commands.add_parser("generate", help="ask a running mmgate")
    generate.add_argument("prompt")
    generate.add_argument("--stream", action="store_true", help="print tokens as they arrive")
    generate.add_argument("--raw", action="store_true", help="no chat template")
    generate.add_argument("--max-tokens", type=int, default=128)
    generate.add_argument(
        "--temperature", type=float, default=0.0, help="0 is greedy (default %(default)s)"
    )
    generate.add_argument("--seed", type=int)
    generate.add_argument(
        "--cache-policy", choices=["prompt", "response", "bypass"], default="prompt"
    )
    generate.add_argument("--tenant")
    generate.add_argument(
        "--adapter", help="a LoRA adapter the caller may use (mmgate's model info)"
    )
    generate.add_argument(
        "--priority",
        type=int,
        help="lower is more urgent, within the caller's range (default: its tenant's)",
    )
    generate.add_argument(
        "--image",
        action="append",
        default=[],
        help="an image file (PNG, JPEG, WebP) for each <image> in the prompt; repeatable",
    )
    generate.add_argument(
        "--image-url",
        action="append",
        default=[],
        metavar="URL",
        help="an image the server fetches (https), after the --image files; repeatable",
    )
    generate.add_argument(
        "--video",
        action="append",
        default=[],
        help="a clip (MP4, WebM, AVI) for each <video> in the prompt; repeatable",
    )
    generate.add_argument(
        "--video-url",
        action="append",
        default=[],
        metavar="URL",
        help="a clip the server fetches (https), after the --video files; repeatable",
    )
    generate.add_argument(
        "--frames",
        type=arguments.count,
        help="frames sampled from each clip, at most (default: the server's most)",
    )
    generate.add_argument(
        "-n", type=arguments.count, default=1, help="samples of the prompt (not with --stream)"
    )
    generate.add_argument(
        "--logprobs",
        type=int,
        metavar="K",
        help="print each token's log-probability and the K most likely alternatives",
    )
    generate.add_argument(
        "--tool",
        action="append",
        default=[],
        metavar="FILE",
        help="a JSON file of a function the model may call (name, description, parameters;"
        " or a list of them, or OpenAI's form); repeatable",
    )
    generate.add_argument(
        "--tool-choice", help="none, auto (the default with tools), required, or a function's name"
    )
    form = generate.add_mutually_exclusive_group()
    form.add_argument("--json-schema", metavar="FILE", help="the answer is an instance of it")
    form.add_argument("--regex", help="the answer matches this regular expression")
    form.add_argument(
        "--choice", action="append", help="the answer is one of these strings; repeatable"
    )

    stats = commands.add_parser("stats", help="cache levels and actor health")
    stats.add_argument(
        "--watch",
        nargs="?",
        type=arguments.positive,
        const=2.0,
        metavar="SECONDS",
        help="redraw every SECONDS (default %(const)s) until Ctrl-C",
    )
    stats.add_argument(
        "--count", type=arguments.count, metavar="N", help="with --watch: stop after N tables"
    )
    bench.add_parser(commands)
    watch = cache_watch.add_parser(commands)
    models = commands.add_parser("models", help="model files")
    model_commands = models.add_subparsers(dest="models_command", required=True)
    prepare = model_commands.add_parser("prepare", help="convert the embedded default model")
    prepare.add_argument("--cache", help="folder for converted models")
    for name, what in (
        ("tiny", "a tiny random Llama"),
        ("tiny-llava", "a tiny random LLaVA"),
        ("tiny-video", "a tiny random Qwen2-VL (video)"),
        ("vitl-llava", "a random LLaVA with a ViT-L/14-336-sized vision tower"),
        ("qwen2vl-video", "a random Qwen2-VL with a Qwen2-VL-2B-sized video tower"),
    ):
        build = model_commands.add_parser(name, help=f"build {what} for tests, once")
        build.add_argument("path", help="the model folder to write")
        build.add_argument("--seed", type=int, default=0, help="fixes the random weights")
    adapter = model_commands.add_parser("adapter", help="build a random LoRA adapter for tests")
    adapter.add_argument("model", help="the model folder it adapts")
    adapter.add_argument("path", help="the adapter folder to write")
    adapter.add_argument("--seed", type=int, default=0, help="fixes the random weights")
    adapter.add_argument("--rank", type=arguments.count, default=8)
    adapter.add_argument(
        "--vision",
        action="store_true",
        help="a vision-tower layer too (embeddings mode refuses it)",
    )
    for sub in (generate, stats, watch):
        sub.add_argument("--target", default=DEFAULT_TARGET)
        sub.add_argument("--timeout", type=float, default=120.0)
        arguments.add_credentials(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["serve"]:
        return _serve(argv[1:])
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "generate" and args.stream and args.n > 1:
        parser.error("--stream shows one sample: leave out -n, or --stream")
    try:
        if args.command == "generate":
            args.image_bytes = [Path(path).read_bytes() for path in args.image]
            args.video_bytes = [Path(path).read_bytes() for path in args.video]
            schema = args.json_schema
            args.json_schema_text = Path(schema).read_text("utf-8") if schema else None
            args.tools = [tool for path in args.tool for tool in _tools_in(Path(path))]
            return asyncio.run(_generate(args))
        if args.command == "stats":
            return asyncio.run(_stats(args))
        if args.command == "cache":
            return asyncio.run(_cache_watch(args))
        if args.command == "bench":
            return bench.main(args)
        return _models(args)
    except grpc.aio.AioRpcError as error:
        sys.stderr.write(f"mmgate: {error.code().name}: {error.details()}\n")
        return 1
