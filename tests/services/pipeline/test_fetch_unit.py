"""The image URL guard's address rules and settings, without a network: each kind of address an
SSRF aims at, in its IPv4 and IPv6 forms; the allow-list's entries checked at start. How long a
shared fetch lasts (its waiters' deadlines, not its leader's) and that it stops once nobody waits,
with the host's side held in a future.

The fetch itself (pinning, redirects, caps, coalescing) runs against real HTTPS servers in
tests/services/pipeline/test_image_urls.py."""

from __future__ import annotations

import asyncio
import ipaddress
import time

import pydantic
import pytest

from cache_actor import CacheActor
from services.config import MediaSettings
from services.errors import ImageFetchFailed
from services.pipeline.cache_front import CacheFront
from services.pipeline.media.fetch import Fetched, ImageFetcher, Wanted, refused_kind
from services.pipeline.request import MediaCall
from tests.support import until


@pytest.mark.parametrize(
    ("address", "kind"),
    [
        ("127.0.0.1", "loopback"),
        ("127.0.0.3", "loopback"),
        ("::1", "loopback"),
        ("::ffff:127.0.0.1", "loopback"),  # IPv4-mapped
        ("169.254.169.254", "link-local (cloud metadata)"),
        ("fe80::1", "link-local (cloud metadata)"),
        ("::ffff:169.254.169.254", "link-local (cloud metadata)"),
        ("10.1.2.3", "private"),
        ("172.16.0.1", "private"),
        ("192.168.1.10", "private"),
        ("fd00:ec2::254", "private"),  # a cloud's IPv6 metadata address
        ("2002:a01:203::1", "private"),  # 6to4 around 10.1.2.3
        ("0.0.0.0", "unspecified"),
        ("::", "unspecified"),
        ("224.0.0.1", "multicast"),
        ("ff02::1", "multicast"),
        ("100.100.100.200", "reserved"),  # shared address space (a cloud's metadata)
        ("240.0.0.1", "reserved"),
    ],
)
def test_every_internal_kind_of_address_is_refused(address: str, kind: str) -> None:
    assert refused_kind(ipaddress.ip_address(address)) == kind


@pytest.mark.parametrize("address", ["93.184.215.14", "1.1.1.1", "2606:4700:4700::1111"])
def test_a_public_address_is_not(address: str) -> None:
    assert refused_kind(ipaddress.ip_address(address)) is None


def test_the_allow_list_takes_hosts_and_networks_only() -> None:
    settings = MediaSettings(url_allow=["127.0.0.2/32", "CDN.Example.com", "10.0.0.0/8"])
    assert settings.url_allow == ["127.0.0.2/32", "cdn.example.com", "10.0.0.0/8"]
    assert MediaSettings().url_schemes == ["https"]
    for bad in ("https://cdn.example.com", "cdn example", "10.0.0.0/33"):
        with pytest.raises(pydantic.ValidationError):
            MediaSettings(url_allow=[bad])
    with pytest.raises(pydantic.ValidationError):
        MediaSettings(url_schemes=["ftp"])


async def test_in_degraded_mode_each_request_fetches_for_itself() -> None:
    cache = CacheFront(CacheActor)
    cache.start()
    cache.found_stalled()
    fetcher = ImageFetcher(MediaSettings(), cache)
    urls: list[str] = []

    async def fetch_once(index: int, url: str, wanted: Wanted) -> Fetched:
        urls.append(url)
        return Fetched(b"bytes", "image/png", time.monotonic())

    fetcher._fetch = fetch_once  # type: ignore[method-assign]
    call = MediaCall("t", time.monotonic() + 5)
    await asyncio.gather(*(fetcher.fetch(0, "https://a.test/x.png", call) for _ in range(3)))
    assert len(urls) == 3  # uncoalesced, unstored
    assert fetcher.stats.outcomes == {"bypass": 3}
    await fetcher.aclose()
    await cache.aclose()


async def test_bytes_older_than_the_freshness_window_are_fetched_anew() -> None:
    cache = CacheFront(CacheActor)
    cache.start()
    fetcher = ImageFetcher(MediaSettings(url_fresh_seconds=0), cache)
    stamps = iter((100.0, 200.0))

    async def fetch_once(index: int, url: str, wanted: Wanted) -> Fetched:
        return Fetched(b"bytes", "image/png", next(stamps))

    fetcher._fetch = fetch_once  # type: ignore[method-assign]
    call = MediaCall("t", time.monotonic() + 5)
    first = await fetcher.fetch(0, "https://a.test/x.png", call)
    again = await fetcher.fetch(0, "https://a.test/x.png", call)
    assert (first.fetched_at, again.fetched_at) == (100.0, 200.0)  # stale: fetched again
    assert fetcher.stats.outcomes == {"miss": 2}
    await fetcher.aclose()
    await cache.aclose()


class Host:
    """``ImageFetcher._follow`` held until the test answers: counts its calls, and notices
    being cancelled (what closes the connection in the real one)."""

    def __init__(self) -> None:
        self.calls = 0
        self.answer = asyncio.Event()
        self.asked = asyncio.Event()
        self.cancelled = asyncio.Event()

    async def __call__(self, index: int, url: str, wanted: Wanted) -> tuple[bytes, str, int]:
        self.calls += 1
        self.asked.set()
        try:
            await self.answer.wait()
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        return b"bytes", "image/png", 200


async def test_a_shared_fetch_lasts_to_its_longest_waiter_not_its_leader() -> None:
    cache = CacheFront(CacheActor)
    cache.start()
    fetcher = ImageFetcher(MediaSettings(), cache)
    fetcher._follow = host = Host()  # type: ignore[method-assign]
    url = "https://a.test/x.png"
    leader = asyncio.ensure_future(fetcher.fetch(0, url, MediaCall("t", time.monotonic() + 0.2)))
    await host.asked.wait()
    follower = asyncio.ensure_future(fetcher.fetch(1, url, MediaCall("t", time.monotonic() + 30)))
    await until(lambda: cache.stats().waiters == 2)
    await asyncio.wait([leader])  # its deadline passes: it alone leaves
    host.answer.set()  # the host answers only now
    assert (await follower).data == b"bytes"  # once: "the fetch outlived the deadline"
    late = leader.exception()
    assert isinstance(late, ImageFetchFailed)
    assert (late.kind, late.index) == ("timeout", 0)
    assert not host.cancelled.is_set()
    assert host.calls == 1
    assert fetcher.stats.outcomes == {"timeout": 1, "coalesced": 1}
    await fetcher.aclose()
    await cache.aclose()


@pytest.mark.parametrize("leaves", ["cancelled", "deadline"])
async def test_a_fetch_nobody_waits_for_stops_and_stores_nothing(leaves: str) -> None:
    cache = CacheFront(CacheActor)
    cache.start()
    fetcher = ImageFetcher(MediaSettings(), cache)
    fetcher._follow = host = Host()  # type: ignore[method-assign]
    url = "https://a.test/x.png"
    call = MediaCall("t", time.monotonic() + (30 if leaves == "cancelled" else 0.2))
    callers = [asyncio.ensure_future(fetcher.fetch(0, url, call)) for _ in range(2)]
    await until(lambda: cache.stats().waiters == 2)
    await host.asked.wait()
    if leaves == "cancelled":
        for caller in callers:
            caller.cancel()
    results = await asyncio.gather(*callers, return_exceptions=True)
    assert all(isinstance(r, asyncio.CancelledError | ImageFetchFailed) for r in results)
    async with asyncio.timeout(5):
        await host.cancelled.wait()  # the last one gone: the fetch is cancelled at once
    await until(lambda: cache.stats().flights == 0)
    assert cache.stats().entries == 0
    assert host.calls == 1
    await fetcher.aclose()
    await cache.aclose()
