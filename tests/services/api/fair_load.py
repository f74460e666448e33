"""A tenant's closed-loop load, in a process of its own: ``python -m tests.services.api.fair_load``.

The priority test keeps the engine saturated with a tenant's low-priority streams while the
test's own process sends urgent ones; each of a load's 44 streams reads every token, work kept
out of the test's process. It prints one JSON line per request:
when it was sent, its first token, its end (time.monotonic(), the same clock in every process
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


async def worker(client: MmgateClient, tokens: int, until: float) -> list[dict[str, object]]:
    seen: list[dict[str, object]] = []
    while time.monotonic() < until:
        sent, first = time.monotonic(), None
        request = build_request("Tell me a story", max_tokens=tokens, ignore_eos=True)
        try:
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
    parser.add_argument("--seconds", type=float, required=True, help="how long to send, once up")
    args = parser.parse_args()
    until = time.monotonic() + args.seconds
    async with MmgateClient(args.target, tenant=args.tenant) as client:
        done = await asyncio.gather(*(worker(client, t, until) for t in args.tokens))
    for seen in done:
        for record in seen:
            sys.stdout.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    asyncio.run(main())
