"""Cache.Watch on a real server (the tiny LLaVA, token auth over TLS, tenants alpha, beta and ops,
an admin): a tenant's watcher sees its images admitted, evicted under its budget's pressure and
invalidated; another tenant's watcher sees none of it; a watcher that resumes from the last
sequence number it saw gets exactly the events it missed; an admin may watch everyone."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
from collections.abc import AsyncGenerator, AsyncIterator

import grpc
import pytest

from services.client import MmgateClient
from services.proto.mmgate.v1 import cache_pb2
from tests.services.auth.support import TOKENS, Pki, as_tenant
from tests.services.imagegen import png
from tests.services.prom import scrape
from tests.support import RunningServer

pytestmark = pytest.mark.asyncio(loop_scope="module")

WAIT = 30.0  # seconds for an event that is due


def tenant(server: RunningServer, pki: Pki, name: str) -> MmgateClient:
    return MmgateClient(server.target, credentials=as_tenant(pki, name), timeout=120.0)


class Watching:
    """A watch stream read in the background: its events as they come, in order."""

    def __init__(self, events: AsyncGenerator[cache_pb2.WatchEvent, None]) -> None:
        self.events = events
        self.seen: list[cache_pb2.WatchEvent] = []
        # None: the stream ended (its error, if any, in ``error``)
        self.queue: asyncio.Queue[cache_pb2.WatchEvent | None] = asyncio.Queue()
        self.error: grpc.aio.AioRpcError | None = None
        self.task = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        try:
            async for event in self.events:
                self.seen.append(event)
                self.queue.put_nowait(event)
        except grpc.aio.AioRpcError as error:
            self.error = error
        self.queue.put_nowait(None)

    async def until(self, kind: str, digest: str = "") -> list[cache_pb2.WatchEvent]:
        """The events up to and including the next of ``kind`` (for ``digest``)."""
        got = []
        async with asyncio.timeout(WAIT):
            while True:
                event = await self.queue.get()
                if event is None:
                    raise self.error or AssertionError(f"the stream ended before {kind}")
                got.append(event)
                if event.kind == kind and (not digest or event.digest == digest):
                    return got

    async def close(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task
        await self.events.aclose()


@contextlib.asynccontextmanager
async def watching(
    client: MmgateClient, since: int = 0, **options: object
) -> AsyncIterator[Watching]:
    watch = Watching(client.watch(since, timeout=300.0, **options))  # type: ignore[arg-type]
    try:
        await watch.until("synced")
        yield watch
    finally:
        await watch.close()


def kinds(events: list[cache_pb2.WatchEvent]) -> list[tuple[str, str, str]]:
    return [(e.kind, e.tenant, e.digest or e.key) for e in events]


async def test_a_tenants_watcher_sees_its_admits_evictions_and_invalidations(
    token_server: RunningServer, pki: Pki
) -> None:
    async with (
        tenant(token_server, pki, "alpha") as alpha,
        tenant(token_server, pki, "beta") as beta,
        tenant(token_server, pki, "ops") as ops,
        watching(alpha) as mine,
        watching(alpha) as resumer,
        watching(beta) as theirs,
        watching(ops, all_tenants=True) as everyone,
    ):
        assert mine.seen[-1].snapshot  # a first watch starts from a snapshot
        held = await alpha.prefetch(png(7001))
        (admit,) = [e for e in await mine.until("admit", held.digest) if e.kind == "admit"]
        assert (admit.stage, admit.tenant, admit.tier) == ("image", "alpha", "")
        assert admit.bytes > 0
        assert (await everyone.until("admit", held.digest))[-1].tenant == "alpha"
        assert await alpha.invalidate(digest=held.digest)
        await mine.until("invalidate", held.digest)

        # the budget's pressure: alpha's images until the least recently used one goes
        evicted = None
        for n in range(400):
            await alpha.prefetch(png(7100 + n))
            if any(e.kind == "evict" for e in mine.seen):
                evicted = next(e for e in mine.seen if e.kind == "evict")
                break
        assert evicted is not None, "no eviction within 400 images"
        assert (evicted.tenant, evicted.stage) == ("alpha", "image")

        # a watcher that goes and resumes from its last sequence number: exactly what it missed
        await resumer.until("evict")
        last = resumer.seen[-1].sequence
        await resumer.close()
        for n in range(3):
            await alpha.prefetch(png(7600 + n))
        gone = await alpha.prefetch(png(7600))
        assert gone.outcome == "hit"
        assert await alpha.invalidate(digest=gone.digest)
        await mine.until("invalidate", gone.digest)
        missed = [e for e in mine.seen if e.sequence > last]
        async with watching(alpha, since=last) as resumed:
            replayed = [e for e in resumed.seen if e.kind != "synced"]
            assert not resumed.seen[-1].snapshot  # the events missed, not a snapshot
        assert kinds(replayed) == kinds(missed)
        assert [e.sequence for e in replayed] == [e.sequence for e in missed]
        assert len(missed) >= 4  # three admits (each evicting one) and an invalidation

        # beta saw none of alpha's entries; only an admin may look further
        assert [e.kind for e in theirs.seen] == ["synced"]
        for options, code in (
            ({"tenant": "alpha"}, grpc.StatusCode.NOT_FOUND),
            ({"all_tenants": True}, grpc.StatusCode.PERMISSION_DENIED),
            ({"stage": "pixels"}, grpc.StatusCode.INVALID_ARGUMENT),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                async with watching(beta, **options):
                    pass
            assert refused.value.code() == code, options
            assert "alpha" not in (refused.value.details() or "")
        # watchers are bounded (16): one more is refused, the others go on
        extra = [Watching(beta.watch(timeout=300.0)) for _ in range(16 - 3)]
        for one in extra:
            await one.until("synced")
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            async with watching(beta):
                pass
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "watchers" in (refused.value.details() or "")
        for one in extra:
            await one.close()
        held = await alpha.prefetch(png(7700))
        await mine.until("admit", held.digest)
        metrics = await scrape(token_server.metrics_url)
        assert metrics.value("mmgate_cache_watchers") == 3  # mine, theirs, everyone's
        assert metrics.value("mmgate_cache_watch_events_total") >= len(mine.seen)


async def test_the_command_line_view_shows_a_tenants_entries(
    token_server: RunningServer, pki: Pki
) -> None:
    async with tenant(token_server, pki, "beta") as beta:
        held = await beta.prefetch(png(7900))
    done = await asyncio.to_thread(
        subprocess.run,
        [
            sys.executable,
            "-m",
            "services.cli",
            "cache",
            "watch",
            "--target",
            token_server.target,
            "--tls-ca",
            str(pki.ca.issued.cert),
            "--stage",
            "image",
            "--snapshot",
        ],
        env={**os.environ, "MMGATE_TOKEN": TOKENS["beta"]},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    *entries, synced = done.stdout.splitlines()
    # beta's snapshot: its image among its own entries, nothing of alpha's; then synced
    assert any(f"held       image     beta         {held.digest}" in line for line in entries)
    assert all(line.split()[1:4] == ["held", "image", "beta"] for line in entries)
    assert synced.split()[1] == "synced"
