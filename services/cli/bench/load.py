"""The load loops of ``mmgate bench``: closed (fixed concurrency) or open (fixed arrival rate).

    closed: N workers, each sending its next request as soon as its last one is answered
    open:   a request every 1/rate seconds on average (exponential gaps, a Poisson process),
            whether or not earlier ones are answered; at most ``max_in_flight`` at once (beyond
            it the arrival is counted as dropped by the client: the server is not keeping up)

Each request is one streamed Generate call with the client's deadline; what comes back is one
``Outcome``: when it was sent, its time to first token and to its end, tokens, status, and the
cache lookups its final message reports. Both loops stop at ``requests`` or ``duration``,
whichever comes first, and wait for what is in flight (each call is bounded by its deadline).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import final

import grpc

from ...client import MmgateClient, error_reason
from ...proto.mmgate.v1 import inference_pb2
from .workload import Planned, Workload


@final
@dataclass(slots=True)
class Outcome:
    index: int
    kind: str
    started: float  # seconds since the run began
    code: str = "OK"  # the gRPC status; CANCELLED: the client cancelled it (cancel_ratio)
    reason: str = ""  # mmgate's ErrorInfo reason of a failure (OVERLOADED, INJECTED_FAULT, ...)
    message: str = ""  # the status message of a failure
    ttft: float | None = None
    latency: float = 0.0
    tokens: int = 0
    # (stage, outcome, tier) of each cache lookup the server reported (an image as one)
    lookups: list[tuple[str, str, str]] = field(default_factory=list)


@final
@dataclass(frozen=True, slots=True)
class Limits:
    requests: int | None = None
    duration: float | None = None
    concurrency: int = 8  # closed loop
    rate: float | None = None  # open loop, requests per second
    max_in_flight: int = 256  # open loop
    timeout: float = 120.0


async def one(client: MmgateClient, planned: Planned, began: float, timeout: float) -> Outcome:
    start = time.perf_counter()
    outcome = Outcome(planned.index, planned.kind, start - began)
    stream = client.generate(planned.request, timeout=planned.timeout or timeout)
    try:
        async with asyncio.timeout(planned.cancel_after), contextlib.aclosing(stream) as events:
            async for event in events:
                _take(outcome, event, start)
    except TimeoutError:  # the client's own cancellation, not a deadline (that is a status)
        outcome.code = "CANCELLED"
    except grpc.aio.AioRpcError as error:
        outcome.code = error.code().name
        outcome.reason = error_reason(error)
        outcome.message = error.details() or ""
    outcome.latency = time.perf_counter() - start
    return outcome


def _take(outcome: Outcome, event: inference_pb2.GenerateResponse, start: float) -> None:
    if event.HasField("delta"):
        if outcome.ttft is None and (event.delta.text or event.delta.token_ids):
            outcome.ttft = time.perf_counter() - start
        outcome.tokens += len(event.delta.token_ids)
    else:
        cache = event.final.cache
        outcome.lookups = [
            (lookup.stage, lookup.outcome, lookup.tier or "none") for lookup in cache.lookups
        ] + [("image", image.outcome, image.tier or "none") for image in cache.images]


async def run(
    client: MmgateClient,
    workload: Workload,
    limits: Limits,
    on_done: Callable[[Outcome], None] = lambda outcome: None,
) -> tuple[list[Outcome], int, float]:
    """Send the load; every outcome, the arrivals dropped (open loop), and the wall time."""
    began = time.perf_counter()
    deadline = began + limits.duration if limits.duration is not None else None
    outcomes: list[Outcome] = []
    sent = 0

    def more() -> bool:
        if limits.requests is not None and sent >= limits.requests:
            return False
        return deadline is None or time.perf_counter() < deadline

    async def send(planned: Planned) -> None:
        outcome = await one(client, planned, began, limits.timeout)
        outcomes.append(outcome)
        on_done(outcome)

    dropped = 0
    if limits.rate is None:

        async def worker() -> None:
            nonlocal sent
            while more():
                sent += 1
                await send(workload.next())

        await asyncio.gather(*(worker() for _ in range(limits.concurrency)))
    else:
        rng = random.Random(workload.mix.seed)
        in_flight: set[asyncio.Task[None]] = set()
        next_at = time.perf_counter()
        while more():
            planned = workload.next()
            sent += 1
            if len(in_flight) >= limits.max_in_flight:
                dropped += 1
            else:
                task = asyncio.create_task(send(planned))
                in_flight.add(task)
                task.add_done_callback(in_flight.discard)
            next_at += rng.expovariate(limits.rate)
            # the arrival process itself: the gap until the next request, by design
            await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
        if in_flight:
            await asyncio.gather(*in_flight)
    return outcomes, dropped, time.perf_counter() - began


__all__ = ["Limits", "Outcome", "one", "run"]
