"""Cache.Watch on a real server (the tiny LLaVA, token auth over TLS, tenants alpha, beta and ops,
an admin): a tenant's watcher sees its images admitted, evicted under its budget's pressure and
invalidated; another tenant's watcher sees none of it; a watcher that resumes from the last
sequence number it saw gets exactly the events it missed; an admin may watch everyone. Each
tenant's events are numbered on their own (another tenant's activity moves nothing of its count),
a tenant holds at most its share of the watchers, and a watcher that reads nothing is ended."""

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
from services.client.credentials import channel_options
from services.proto.mmgate.v1 import cache_pb2
from tests.services.auth.support import TOKENS, Pki, as_tenant
from tests.services.imagegen import png
from tests.services.prom import scrape
from tests.support import RunningServer

pytestmark = pytest.mark.asyncio(loop_scope="module")

WAIT = 30.0  # seconds for an event that is due
# conftest.py's token_server: MMGATE_CACHE__MAX_WATCHERS, MMGATE_CACHE__WATCH_IDLE_SECONDS
MAX_WATCHERS, PER_TENANT, IDLE_SECONDS = 8, 4, 2
# a client that reads nothing takes what HTTP/2 flow control lets in: without BDP probing and
# with a small lookahead, about a kilobyte, so the server's writes to it soon wait
NO_READER = [("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", 1024)]


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


def live(watch: Watching) -> list[cache_pb2.WatchEvent]:
    """The events after its "synced"."""
    synced = next(n for n, e in enumerate(watch.seen) if e.kind == "synced")
    return watch.seen[synced + 1 :]


def numbered_on(watch: Watching) -> None:
    """Its live events are numbered one after another from its "synced": no holes."""
    synced = next(e for e in watch.seen if e.kind == "synced")
    numbers = [e.sequence for e in live(watch)]
    assert numbers == list(range(synced.sequence + 1, synced.sequence + 1 + len(numbers)))


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


async def read_to_end(
    stream: AsyncIterator[cache_pb2.WatchEvent], into: list[cache_pb2.WatchEvent]
) -> None:
    async for event in stream:
        into.append(event)


async def test_a_tenants_sequence_numbers_count_its_own_events_alone(
    token_server: RunningServer, pki: Pki
) -> None:
    """beta's admits move nothing of alpha's count (they would tell alpha how busy beta is);
    resuming from a number of alpha's count still works across them. The admin's watch of
    every tenant counts all their events together."""
    async with (
        tenant(token_server, pki, "alpha") as alpha,
        tenant(token_server, pki, "beta") as beta,
        tenant(token_server, pki, "ops") as ops,
        watching(alpha) as mine,
        watching(beta) as theirs,
        watching(ops, all_tenants=True) as everyone,
    ):
        start = mine.seen[-1].sequence  # synced: alpha's count now
        for n in range(3):
            held = await beta.prefetch(png(8000 + n))
            await theirs.until("admit", held.digest)
        async with watching(alpha) as again:
            assert again.seen[-1].sequence == start  # beta's admits: not a number of alpha's
        held = await alpha.prefetch(png(8010))
        await mine.until("admit", held.digest)
        assert [e.tenant for e in live(mine)] == ["alpha"] * len(live(mine))
        assert live(mine)[0].sequence == start + 1
        last = live(mine)[-1].sequence

        # alpha resumes from its own number, beta busy meanwhile: exactly what alpha missed
        held = await beta.prefetch(png(8003))
        await theirs.until("admit", held.digest)
        held = await alpha.prefetch(png(8011))
        await mine.until("admit", held.digest)
        await everyone.until("admit", held.digest)
        async with watching(alpha, since=last) as resumed:
            replayed = [e for e in resumed.seen if e.kind != "synced"]
            assert not resumed.seen[-1].snapshot
            assert resumed.seen[-1].sequence == live(mine)[-1].sequence
        assert kinds(replayed) == kinds([e for e in live(mine) if e.sequence > last])
        assert [e.sequence for e in replayed] == list(range(last + 1, last + 1 + len(replayed)))

        for watch in (mine, theirs, everyone):
            numbered_on(watch)
        assert {e.tenant for e in live(everyone)} == {"alpha", "beta"}


async def test_a_tenant_holds_at_most_its_share_of_the_watchers(
    token_server: RunningServer, pki: Pki
) -> None:
    """alpha's watchers, unread, up to its share: one more is refused, while beta and the admin
    still watch; the server's bound holds over all of them."""
    async with (
        tenant(token_server, pki, "alpha") as alpha,
        tenant(token_server, pki, "beta") as beta,
        tenant(token_server, pki, "ops") as ops,
    ):
        opened: list[Watching] = []
        try:
            for client in [alpha] * PER_TENANT + [beta] * PER_TENANT:
                opened.append(Watching(client.watch(timeout=300.0)))
                await opened[-1].until("synced")
                if len(opened) == PER_TENANT:
                    with pytest.raises(grpc.aio.AioRpcError) as refused:
                        async with watching(alpha):
                            pass
                    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                    assert f"alpha has {PER_TENANT} cache watchers" in str(refused.value.details())
                    async with watching(ops, all_tenants=True), watching(beta):
                        pass  # the others are served
            assert len(opened) == MAX_WATCHERS
            # the server's bound: the admin's share is free, the server's is not
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                async with watching(ops, all_tenants=True):
                    pass
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert f"{MAX_WATCHERS} cache watchers already" in str(refused.value.details())
            await opened.pop(0).close()  # alpha gives one back: the admin's turn
            async with watching(ops, all_tenants=True):
                pass
        finally:
            for one in opened:
                await one.close()


async def test_a_watcher_that_reads_nothing_is_ended(token_server: RunningServer, pki: Pki) -> None:
    """A client that stops reading: once the server's writes to it have waited
    MMGATE_CACHE__WATCH_IDLE_SECONDS, its slot is given back, counted as a gap, and its stream
    ends, after what it was sent, with RESOURCE_EXHAUSTED in mmgate's words."""
    credentials = as_tenant(pki, "alpha")
    channel = grpc.aio.secure_channel(
        token_server.target,
        credentials.channel_credentials(),
        options=[*channel_options(retries=False), *NO_READER],
    )
    async with (
        tenant(token_server, pki, "alpha") as alpha,
        MmgateClient(token_server.target, credentials=credentials, channel=channel) as reader,
    ):
        stream = reader.watch(timeout=300.0)
        try:
            synced = await anext(stream)
            while synced.kind != "synced":
                synced = await anext(stream)
            before = await scrape(token_server.metrics_url)
            watchers = before.value("mmgate_cache_watchers")
            # alpha's images until the writes to the reader wait, then the idle limit more
            async with asyncio.timeout(WAIT):
                seed = 8200
                while (await scrape(token_server.metrics_url)).value(
                    "mmgate_cache_watchers"
                ) == watchers:
                    await alpha.prefetch(png(seed))
                    seed += 1
            after = await scrape(token_server.metrics_url)
            assert after.value("mmgate_cache_watchers") == watchers - 1
            assert (
                after.value("mmgate_cache_watch_gaps_total")
                == before.value("mmgate_cache_watch_gaps_total") + 1
            )
            # what it was sent arrives when it reads again, numbered without holes; then the end
            sent: list[cache_pb2.WatchEvent] = []
            with pytest.raises(grpc.aio.AioRpcError) as ended:
                await asyncio.wait_for(read_to_end(stream, sent), WAIT)
            assert ended.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert f"read nothing for {IDLE_SECONDS} s" in str(ended.value.details())
            assert sent
            assert all(e.tenant == "alpha" and e.kind != "gap" for e in sent)
            numbers = [e.sequence for e in sent]
            assert numbers == list(range(synced.sequence + 1, synced.sequence + 1 + len(sent)))
        finally:
            await stream.aclose()
