"""``mmgate cache watch``: what a replica's cache holds, as it changes (Cache.Watch).

    held ... (the snapshot) ─ synced ─ admit / evict / expire / invalidate ... ─ gap ─▶ resume

One line an event; a gap (the view fell behind, or the cache was emptied) resumes from its
sequence number: the events missed while the server still has them, else a new snapshot.
"""

from __future__ import annotations

import argparse
import sys

from cache_actor import Stage

from ..client import MmgateClient
from ..proto.mmgate.v1 import cache_pb2
from . import arguments

STAGES = tuple(stage.value for stage in Stage if stage is not Stage.ANY)


def add_parser(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
) -> argparse.ArgumentParser:
    """``cache watch``; the caller adds --target, --timeout and the credentials."""
    cache = commands.add_parser("cache", help="what the cache holds")
    cache_commands = cache.add_subparsers(dest="cache_command", required=True)
    watch = cache_commands.add_parser("watch", help="each admit, eviction and invalidation, live")
    watch.add_argument("--stage", choices=STAGES, help="only this stage's entries")
    watch.add_argument(
        "--of", dest="of_tenant", default="", metavar="TENANT", help="another tenant's (admin)"
    )
    watch.add_argument("--all-tenants", action="store_true", help="every tenant's entries (admin)")
    watch.add_argument("--since", type=int, default=0, help="resume after this sequence number")
    watch.add_argument("--count", type=arguments.count, metavar="N", help="stop after N events")
    watch.add_argument(
        "--snapshot", action="store_true", help="what is held now, then stop (at synced)"
    )
    watch.add_argument(
        "--seconds", type=arguments.positive, default=24 * 3600.0, help="the call's deadline"
    )
    return watch


def line(event: cache_pb2.WatchEvent) -> str:
    what = event.digest or event.key[:16]
    tier = f" from {event.tier}" if event.tier else ""
    if event.kind in ("synced", "gap"):
        return f"{event.sequence:>8} {event.kind}\n"
    return (
        f"{event.sequence:>8} {event.kind:<10} {event.stage or '-':<9} {event.tenant:<12} "
        f"{what}  {event.bytes} B{tier}\n"
    )


async def watch(client: MmgateClient, args: argparse.Namespace) -> int:
    since, shown = args.since, 0
    while True:
        events = client.watch(
            since,
            stage=args.stage or "",
            tenant=args.of_tenant,
            all_tenants=args.all_tenants,
            timeout=args.seconds,
        )
        resume = None
        async for event in events:
            sys.stdout.write(line(event))
            sys.stdout.flush()
            shown += 1
            if (args.count is not None and shown >= args.count) or (
                args.snapshot and event.kind == "synced"
            ):
                await events.aclose()
                return 0
            if event.kind == "gap":
                resume = event.sequence
        if resume is None:
            return 0
        since = resume


__all__ = ["add_parser", "line", "watch"]
