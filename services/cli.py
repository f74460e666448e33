"""The ``mmgate`` command.

mmgate serve [--port 50051 --engine.model PATH ...]   settings: env MMGATE_*, flags override
mmgate generate "What is the capital of France?" [--stream] [--max-tokens N] [--raw]
mmgate generate "What is in the picture?" --image photo.jpg   (a vision model)
mmgate stats [--target HOST:PORT]
mmgate models prepare [--cache DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

import grpc

from .client import DEFAULT_TARGET, MmgateClient


def _serve(argv: Sequence[str]) -> int:
    from .config import Settings
    from .server import serve

    settings = Settings(_cli_parse_args=list(argv))
    logging.basicConfig(
        level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    asyncio.run(serve(settings))
    return 0


async def _generate(args: argparse.Namespace) -> int:
    options = {
        "raw": args.raw,
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
        "seed": args.seed,
        "cache_policy": args.cache_policy,
        "images": args.image_bytes,
    }
    async with MmgateClient(args.target, tenant=args.tenant, timeout=args.timeout) as client:
        if args.stream:
            async for text in client.stream_text(args.prompt, **options):
                sys.stdout.write(text)
                sys.stdout.flush()
            sys.stdout.write("\n")
        else:
            response = await client.complete(args.prompt, **options)
            sys.stdout.write(response.text + "\n")
    return 0


async def _stats(args: argparse.Namespace) -> int:
    async with MmgateClient(args.target, timeout=args.timeout) as client:
        stats = await client.stats()
    a, e = stats.actor, stats.engine
    rows = [
        ("model", stats.model),
        ("media mode", stats.media_mode),
        (
            "  decoded, encoded (mmgate)",
            f"{stats.media.decodes}, {stats.media.encodes}",
        ),
        ("  refused, not held", f"{stats.media.rejected}, {stats.media.not_held}"),
        ("media/prompt cache (actor)", ""),
        ("  lookups: hit / miss / coalesced", f"{a.hits} / {a.misses} / {a.coalesced}"),
        ("  hit ratio", f"{a.hit_ratio:.3f}"),
        ("  entries, bytes", f"{a.entries}, {a.bytes}"),
        ("  flights, waiters, mailbox", f"{a.flights}, {a.waiters}, {a.mailbox_depth}"),
        ("  alive, loop lag", f"{a.alive}, {a.loop_lag_seconds * 1000:.1f} ms"),
        ("engine prefix cache", ""),
        ("  tokens queried / hit", f"{e.prefix_cache_queries} / {e.prefix_cache_hits}"),
        ("  hit ratio", f"{e.prefix_cache_hit_ratio:.3f}"),
        ("  requests / with cached prefix", f"{e.requests} / {e.requests_with_cached_prefix}"),
        ("  running, waiting, KV usage", f"{e.running}, {e.waiting}, {e.kv_cache_usage:.3f}"),
    ]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        sys.stdout.write(f"{name:<{width}}  {value}\n")
    return 0


def _models(args: argparse.Namespace) -> int:
    from .config import Settings
    from .models import prepare_default_model

    cache = Path(args.cache) if args.cache else Settings().model_cache
    path = prepare_default_model(cache)
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
        "--temperature", type=float, default=0.0, help="0 (the default here) is greedy"
    )
    generate.add_argument("--seed", type=int)
    generate.add_argument(
        "--cache-policy", choices=["prompt", "response", "bypass"], default="prompt"
    )
    generate.add_argument("--tenant")
    generate.add_argument(
        "--image",
        action="append",
        default=[],
        help="an image file (PNG, JPEG, WebP) for each <image> in the prompt; repeatable",
    )

    stats = commands.add_parser("stats", help="cache levels and actor health")
    models = commands.add_parser("models", help="model files")
    model_commands = models.add_subparsers(dest="models_command", required=True)
    prepare = model_commands.add_parser("prepare", help="convert the embedded default model")
    prepare.add_argument("--cache", help="folder for converted models")
    for sub in (generate, stats):
        sub.add_argument("--target", default=DEFAULT_TARGET)
        sub.add_argument("--timeout", type=float, default=120.0)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["serve"]:
        return _serve(argv[1:])
    args = _parser().parse_args(argv)
    try:
        if args.command == "generate":
            args.image_bytes = [Path(path).read_bytes() for path in args.image]
            return asyncio.run(_generate(args))
        if args.command == "stats":
            return asyncio.run(_stats(args))
        return _models(args)
    except grpc.aio.AioRpcError as error:
        sys.stderr.write(f"mmgate: {error.code().name}: {error.details()}\n")
        return 1


if __name__ == "__main__":
    sys.exit(main())
