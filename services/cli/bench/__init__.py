"""``mmgate bench``: load for any mmgate address, and what it did, in figures.

mmgate bench --target HOST:PORT --concurrency 16 --requests 500
mmgate bench --rate 20 --duration 60 --image-ratio 0.5 --image-repeat 0.8 --working-set 32
mmgate bench ... --json run.json --plot run.png

options ─▶ Mix (workload.py) and Limits (load.py) ─▶ run: closed or open loop, a progress bar
    ─▶ Summary (report.py): throughput, TTFT and end-to-end p50/p90/p99, status codes,
       cache lookups by stage/outcome/tier, the client's own CPU ─▶ text, --json, --plot
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

from ...client import DEFAULT_TARGET, Credentials, MmgateClient
from .. import arguments
from .load import Limits, Outcome, run
from .report import Summary, plot, render, summarize
from .workload import Mix, Workload

# the options' defaults are the workload's and the run's own (one source for each)
_MIX = Mix()
_LIMITS = Limits()


def add_parser(commands: Any) -> argparse.ArgumentParser:
    bench: argparse.ArgumentParser = commands.add_parser(
        "bench",
        help="load a running mmgate and report what it did",
        description="Send a reproducible load to a running mmgate and report throughput, "
        "latency percentiles, status codes and cache outcomes.",
    )
    bench.add_argument(
        "--target", metavar="HOST:PORT", default=DEFAULT_TARGET, help="HOST:PORT of mmgate"
    )
    bench.add_argument("--tenant", help="the x-mmgate-tenant header of every request")
    arguments.add_credentials(bench)
    bench.add_argument(
        "--no-retries",
        action="store_true",
        help="see every UNAVAILABLE: no grpc retry of calls that got no answer (reliability runs)",
    )
    bench.add_argument(
        "--timeout",
        metavar="SECONDS",
        type=arguments.positive,
        default=_LIMITS.timeout,
        help="each request's deadline, in seconds (%(default)s)",
    )
    loop = bench.add_argument_group("load (a closed loop unless --rate is given)")
    loop.add_argument(
        "--concurrency",
        metavar="N",
        type=arguments.count,
        default=_LIMITS.concurrency,
        help="closed loop: requests in flight (%(default)s)",
    )
    loop.add_argument(
        "--rate",
        metavar="PER_SECOND",
        type=arguments.positive,
        help="open loop: requests per second (Poisson arrivals)",
    )
    loop.add_argument(
        "--max-in-flight",
        metavar="N",
        type=arguments.count,
        default=_LIMITS.max_in_flight,
        help="open loop: arrivals beyond this many in flight are not sent, and counted "
        "(%(default)s)",
    )
    loop.add_argument(
        "--requests", metavar="N", type=arguments.count, help="stop after this many requests"
    )
    loop.add_argument(
        "--duration",
        metavar="SECONDS",
        type=arguments.positive,
        help="stop sending after this many seconds",
    )
    mix = bench.add_argument_group("requests")
    mix.add_argument(
        "--max-tokens",
        metavar="N",
        type=arguments.count,
        default=_MIX.max_tokens,
        help="tokens per answer (%(default)s)",
    )
    mix.add_argument(
        "--prompt-words",
        metavar="N",
        type=arguments.count,
        default=_MIX.prompt_words,
        help="words per prompt (%(default)s)",
    )
    mix.add_argument(
        "--temperature",
        type=float,
        default=_MIX.temperature,
        help="0 is greedy (default %(default)s)",
    )
    mix.add_argument(
        "--cache-policy", choices=["prompt", "response", "bypass"], default=_MIX.cache_policy
    )
    mix.add_argument(
        "--stream-interval",
        metavar="N",
        type=arguments.count,
        default=_MIX.stream_interval,
        help="tokens per streamed message (default: the server's)",
    )
    mix.add_argument(
        "--image-ratio",
        metavar="SHARE",
        type=arguments.share,
        default=_MIX.image_ratio,
        help="share of requests with an image (%(default)s)",
    )
    mix.add_argument(
        "--image-repeat",
        metavar="SHARE",
        type=arguments.share,
        default=_MIX.image_repeat,
        help="share of image requests that reuse an image of the working set (%(default)s)",
    )
    mix.add_argument(
        "--working-set",
        metavar="N",
        type=arguments.count,
        default=_MIX.working_set,
        help="distinct images to reuse (%(default)s)",
    )
    mix.add_argument(
        "--image-size",
        metavar="WxH",
        type=arguments.size,
        # written as on the command line: argparse passes a string default through ``type``
        default="{}x{}".format(*_MIX.image_size),
        help="WIDTHxHEIGHT of images (%(default)s)",
    )
    mix.add_argument(
        "--burst-every",
        metavar="N",
        type=int,
        default=_MIX.burst_every,
        help="after every N requests, a burst of identical deterministic requests "
        "(0: none; default %(default)s)",
    )
    mix.add_argument(
        "--burst-size",
        metavar="N",
        type=arguments.count,
        default=_MIX.burst_size,
        help="identical requests in a burst (%(default)s)",
    )
    mix.add_argument(
        "--seed", type=int, default=_MIX.seed, help="the same seed sends the same requests"
    )
    rude = bench.add_argument_group("a misbehaving client (reliability runs)")
    rude.add_argument(
        "--cancel-ratio",
        metavar="SHARE",
        type=arguments.share,
        default=_MIX.cancel_ratio,
        help="share of requests the client cancels at a random moment (%(default)s); counted as "
        "CANCELLED",
    )
    rude.add_argument(
        "--cancel-within",
        metavar="SECONDS",
        type=arguments.positive,
        default=_MIX.cancel_within,
        help="a cancelled request is cancelled within this long of being sent (%(default)s)",
    )
    rude.add_argument(
        "--short-deadline-ratio",
        metavar="SHARE",
        type=arguments.share,
        default=_MIX.short_deadline_ratio,
        help="share of requests sent with a tiny deadline instead of --timeout (%(default)s)",
    )
    rude.add_argument(
        "--short-deadline",
        metavar="SECONDS",
        type=arguments.positive,
        default=_MIX.short_deadline,
        help="the longest of those tiny deadlines, drawn from 1 ms up (%(default)s)",
    )
    out = bench.add_argument_group("output")
    out.add_argument(
        "--json", metavar="PATH", type=Path, help="write the summary and every request as JSON"
    )
    out.add_argument(
        "--plot", metavar="PATH", type=Path, help="write a PNG of latency over time and its spread"
    )
    out.add_argument(
        "--no-progress", action="store_true", help="no progress bar (none when not a terminal)"
    )
    return bench


def main(args: argparse.Namespace) -> int:
    if args.requests is None and args.duration is None:
        sys.stderr.write("mmgate bench: give --requests, --duration or both\n")
        return 2
    if args.cancel_ratio + args.short_deadline_ratio > 1:
        sys.stderr.write("mmgate bench: --cancel-ratio + --short-deadline-ratio exceeds 1\n")
        return 2
    mix = Mix(
        max_tokens=args.max_tokens,
        prompt_words=args.prompt_words,
        temperature=args.temperature,
        cache_policy=args.cache_policy,
        stream_interval=args.stream_interval,
        image_ratio=args.image_ratio,
        image_repeat=args.image_repeat,
        working_set=args.working_set,
        image_size=args.image_size,
        burst_every=args.burst_every,
        burst_size=args.burst_size,
        cancel_ratio=args.cancel_ratio,
        cancel_within=args.cancel_within,
        short_deadline_ratio=args.short_deadline_ratio,
        short_deadline=args.short_deadline,
        seed=args.seed,
    )
    limits = Limits(
        requests=args.requests,
        duration=args.duration,
        concurrency=args.concurrency,
        rate=args.rate,
        max_in_flight=args.max_in_flight,
        timeout=args.timeout,
    )
    progress = not args.no_progress and sys.stderr.isatty()
    outcomes, summary = asyncio.run(
        _bench(
            args.target,
            args.tenant,
            arguments.credentials(args),
            not args.no_retries,
            mix,
            limits,
            progress,
        )
    )
    sys.stdout.write(render(summary, args.target))
    if args.json is not None:
        document = {
            "target": args.target,
            "mix": _plain(mix),
            "limits": _plain(limits),
            "summary": summary.to_json(),
            "requests": [_plain(outcome) for outcome in outcomes],
        }
        args.json.write_text(json.dumps(document, indent=2) + "\n")
    if args.plot is not None:
        plot(outcomes, summary, args.plot, args.target)
    return 0


async def _bench(
    target: str,
    tenant: str | None,
    credentials: Credentials,
    retries: bool,
    mix: Mix,
    limits: Limits,
    progress: bool,
) -> tuple[list[Outcome], Summary]:
    bar: Any = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=limits.requests, unit="req", file=sys.stderr)
    cpu = time.process_time()
    try:
        async with MmgateClient(
            target,
            tenant=tenant,
            credentials=credentials,
            timeout=limits.timeout,
            retries=retries,
        ) as client:
            outcomes, dropped, wall = await run(
                client,
                Workload(mix),
                limits,
                on_done=(lambda outcome: bar.update(1)) if bar is not None else lambda o: None,
            )
    finally:
        if bar is not None:
            bar.close()
    return outcomes, summarize(outcomes, dropped, wall, time.process_time() - cpu)


def _plain(value: Any) -> dict[str, Any]:
    return {name: getattr(value, name) for name in value.__slots__}


__all__ = ["add_parser", "main"]
