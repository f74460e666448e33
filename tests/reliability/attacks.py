"""The hostile tenant of the chaos run: beside the faulted load, one caller sends what once hurt
other tenants (issue by issue in docs/reliability.md), round after round until the load ends:
the corpus's deep nesting in every constraint kind, huge repeated fields, ``$ref`` cycles and
malformed URLs; more adapters than the engine has slots; adapter folders linked out of the root
or holding a FIFO; image URLs that answer at once, after the deadline, or never end (cancelled);
a burst of log-probabilities; a slow schema left compiling at a short deadline. Each attack ends
with the status documented for it, in mmgate's words."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import grpc

from services.client import MmgateClient, build_request
from services.proto.mmgate.v1 import inference_pb2 as pb
from tests.support import slow_schema

from .conftest import CHAOS_ADAPTERS, CHAOS_LORA_SLOTS, ChaosImages
from .corpus import CASES, LEAKS, MAX_DETAILS

# the corpus's cases of each hostile input (their expected status is the corpus's)
FROM_CORPUS = (
    "JSON schema pattern of 30,000 nested groups",
    "regex of 30,000 nested groups",
    "grammar of 30,000 nested groups",
    "JSON schema nested 200 deep",
    "JSON schema $ref cycle",
    "1,000,000 empty stop strings",
    "chat of 300,000 messages",
    "unclosed IPv6 URL",
    "IPv6 URL that is no address",
    "URL with an empty label",
    "URL with a 64-character label",
)
DEADLINE_SECONDS = 1.5  # the late image's and the abandoned compile's deadline
CANCEL_AFTER_SECONDS = 0.5  # the rude caller hangs up on the endless image
SLOW_SCHEMA_PROPERTIES = 40  # a compile of about a second here, abandoned at the deadline


@dataclass(frozen=True)
class Attack:
    name: str
    send: Callable[[MmgateClient], Awaitable[object]]
    expected: frozenset[str]


@dataclass
class Attacks:
    """What the attacks got: codes by attack, and any answer outside its documented set."""

    rounds: int = 0
    codes: dict[str, Counter[str]] = field(default_factory=dict)
    odd: list[str] = field(default_factory=list)

    def add(self, attack: Attack, code: str, details: str) -> None:
        self.codes.setdefault(attack.name, Counter())[code] += 1
        if code not in attack.expected:
            self.odd.append(f"{attack.name}: {code} {details[:200]}")
        if len(details) > MAX_DETAILS or LEAKS.search(details):
            self.odd.append(f"{attack.name}: details leak or overflow: {details[:200]}")

    def summary(self) -> dict[str, dict[str, int]]:
        return {name: dict(sorted(codes.items())) for name, codes in sorted(self.codes.items())}


def image_url(url: str) -> pb.GenerateRequest:
    return build_request("What is in the picture?", images=[url], max_tokens=2, temperature=0.0)


async def cancelled(client: MmgateClient, request: pb.GenerateRequest) -> None:
    """The call, cancelled by its caller after a moment (a client that hangs up)."""
    call = asyncio.ensure_future(client.complete_request(request, timeout=30))
    await asyncio.wait({call}, timeout=CANCEL_AFTER_SECONDS)
    call.cancel()
    await call  # its answer if it came first; else CancelledError


def corpus_case(name: str) -> Attack:
    make, expected, _ = CASES[name]

    async def send(client: MmgateClient) -> object:
        return await client.complete_request(make())

    return Attack(name, send, frozenset({expected}))


async def every_adapter_at_once(client: MmgateClient) -> object:
    """A run on each adapter served, all at once: more adapters than the engine has slots."""
    return await asyncio.gather(
        *(
            client.complete(f"Hello from {name}", adapter=name, max_tokens=4)
            for name in CHAOS_ADAPTERS
        )
    )


def attacks(images: ChaosImages) -> list[Attack]:
    refused = frozenset({"INVALID_ARGUMENT"})
    mix = [corpus_case(name) for name in FROM_CORPUS]
    mix.append(
        Attack(
            f"{len(CHAOS_ADAPTERS)} adapters at once, {CHAOS_LORA_SLOTS} slots",
            every_adapter_at_once,
            frozenset({"OK"}),
        )
    )
    mix += [
        Attack(
            "load: files linked out of the root",
            lambda c: c.load_adapter("out", "links-out"),
            refused,
        ),
        Attack(
            "load: a FIFO for a config", lambda c: c.load_adapter("fifo", "fifo-config"), refused
        ),
        Attack(
            "image URL",
            lambda c: c.complete_request(image_url(images.url("/cat.png")), timeout=30),
            frozenset({"OK"}),
        ),
        Attack(
            "image URL answering after the deadline",
            lambda c: c.complete_request(
                image_url(images.url("/late.png")), timeout=DEADLINE_SECONDS
            ),
            frozenset({"DEADLINE_EXCEEDED"}),
        ),
        Attack(
            "endless image URL, cancelled",
            lambda c: cancelled(c, image_url(images.url("/drip.png"))),
            frozenset({"CANCELLED"}),
        ),
        Attack(
            "log-probabilities: 4 samples x 21 alternatives x 16 tokens",
            lambda c: c.complete("Count on", n=4, temperature=1.0, logprobs=20, max_tokens=16),
            frozenset({"OK"}),
        ),
        Attack(
            "slow schema left compiling at the deadline",
            lambda c: c.complete(
                "A record:",
                json_schema=json.dumps(slow_schema(SLOW_SCHEMA_PROPERTIES)),
                max_tokens=4,
                timeout=DEADLINE_SECONDS,
            ),
            frozenset({"DEADLINE_EXCEEDED", "OK"}),  # OK where its compile was quick enough
        ),
    ]
    return mix


async def attack_until(
    client: MmgateClient, mix: list[Attack], done: asyncio.Event, result: Attacks
) -> None:
    """Round after round of ``mix``, one attack at a time, until ``done`` (one round at least)."""
    while result.rounds == 0 or not done.is_set():
        for attack in mix:
            try:
                await attack.send(client)
            except grpc.aio.AioRpcError as error:
                result.add(attack, error.code().name, error.details() or "")
            except asyncio.CancelledError:
                if asyncio.current_task().cancelling():  # type: ignore[union-attr]
                    raise  # this loop's own cancellation, not the attack's
                result.add(attack, "CANCELLED", "")
            else:
                result.add(attack, "OK", "")
        result.rounds += 1
