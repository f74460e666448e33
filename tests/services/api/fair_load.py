"""A tenant's closed-loop load, in a process of its own: ``python -m tests.services.api.fair_load``.

The fair-share tests measure what each tenant completes while the engine is saturated; a load
generated in the test's own process stalled there now and then (its loop idle for seconds while
the server worked), and a tenant whose clients stall stops saturating: its slots then go, rightly,
to whoever waits. Each tenant's load runs here instead, and prints one JSON line per request:
when it was sent, its first token (streams only), its end (time.monotonic(), the same clock in
every process
on Linux), its queue wait and priority, or its error.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time

import grpc

from services.client import MmgateClient, build_request


async def worker(
    client: MmgateClient, tokens: int, until: float, *, unary: bool
) -> list[dict[str, object]]:
    seen: list[dict[str, object]] = []
    while time.monotonic() < until:
        sent, first = time.monotonic(), None
        request = build_request("Tell me a story", max_tokens=tokens, ignore_eos=True)
        try:
            if unary:  # one message an answer: least work here, where only ends count
                final = (await client.complete_request(request, timeout=120)).final
            else:
                async for event in client.generate(request, timeout=120):
                    if event.HasField("delta") and first is None:
                        first = time.monotonic()
                    if event.HasField("final"):
                        final = event.final
        except grpc.aio.AioRpcError as error:
            seen.append({"sent": sent, "error": error.code().name})
            return seen
        seen.append(
            {
                "sent": sent,
                "first": first,
                "ended": time.monotonic(),
                "queue_ms": final.queue_ms,
                "priority": final.priority,
            }
        )
    return seen


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("target")
    parser.add_argument("tenant")
    parser.add_argument("--tokens", type=int, nargs="+", required=True, help="one per stream")
    parser.add_argument("--until", type=float, required=True, help="time.monotonic() to stop")
    parser.add_argument("--unary", action="store_true", help="Complete: no first token times")
    args = parser.parse_args()
    until = args.until
    async with MmgateClient(args.target, tenant=args.tenant) as client:
        done = await asyncio.gather(
            *(worker(client, t, until, unary=args.unary) for t in args.tokens)
        )
    for seen in done:
        for record in seen:
            sys.stdout.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    asyncio.run(main())
