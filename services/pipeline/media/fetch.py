"""Images and videos by URL: fetched once per tenant and freshness window, behind an address
guard.

    Image.url ─▶ cache.get(("fetch", url), tenant) ─ one flight per URL: the others coalesce
                   └─ fetch: for each hop (the URL, then each redirect, at most url_max_redirects)
                        scheme allowed? no credentials? ─▶ resolve the host once ─▶ the address
                        allowed? (loopback, private, link-local, multicast, unspecified and
                        reserved are not, unless url_allow admits the host or the address)
                        ─▶ connect to that address (TLS checked against the host name): no
                        second lookup for DNS rebinding to change ─▶ 200 and an image type?
                        ─▶ the body, decompressed, counted against max_image_bytes (a video's:
                        max_video_bytes) as it comes
    ─▶ the bytes, and from here the usual path by their digest (decode, encode, tiers, tenancy)

A fetch runs while somebody waits for it, and no longer: each waiter's deadline is its own (the
actor arms it), so a shared fetch lasts to the latest deadline of those still waiting, whoever
started it; once the last waiter has left (cancelled, or past its deadline) the fetch is
cancelled, its connection closed, and nothing is stored (``cancel_when_orphaned``).

Refusals are UrlNotAllowed (PERMISSION_DENIED, the rule named, never an internal host's
address); a fetch that fails is ImageFetchFailed (the upstream's status, never its body).
"""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import socket
import ssl
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Final, final
from urllib.parse import urljoin, urlsplit

import httpx
from prometheus_client.core import Metric

from cache_actor import ComputeTimeout, Outcome, Stage

from ...config import MediaSettings
from ...errors import ImageFetchFailed, UrlNotAllowed
from ...keys import cache_key
from ...observability.media_metrics import FetchStats, fetch_families
from ...observability.spans import span
from ...wire import MIME_TYPES, VIDEO_MIME_TYPES
from ..cache_front import CacheFront, outcome_of
from ..request import MediaCall

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
# host, port -> the addresses the host resolves to, in the resolver's order
Resolver = Callable[[str, int], Awaitable[list[str]]]

_REDIRECTS: Final = frozenset({301, 302, 303, 307, 308})
_CHUNK: Final = 64 * 1024


async def system_resolver(host: str, port: int) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


def refused_kind(address: Address) -> str | None:
    """Why an address is not reachable by default (None: a public address)."""
    if isinstance(address, ipaddress.IPv6Address):
        embedded = address.ipv4_mapped or address.sixtofour
        if embedded is not None:
            return refused_kind(embedded)
    for kind, test in (
        ("unspecified", address.is_unspecified),
        ("loopback", address.is_loopback),
        ("link-local (cloud metadata)", address.is_link_local),
        ("multicast", address.is_multicast),
        ("reserved", address.is_reserved),
        ("private", address.is_private),
        ("reserved", not address.is_global),  # shared, documentation, benchmarking ranges
    ):
        if test:
            return kind
    return None


def url_problem(url: str) -> str | None:
    """What makes a URL unusable as written (None: it parses, with a host name or address
    that can be looked up), in mmgate's words: the parser's own errors name its internals."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        _ = parts.port
    except ValueError:
        return "not a valid URL (its host or port does not parse)"
    try:
        host.encode("idna")
    except UnicodeError:
        # an empty label ("a..b") or one over 63 characters: no resolver takes it
        return "not a valid host name (an empty label, or one over 63 characters)"
    return None


@final
@dataclasses.dataclass(frozen=True, slots=True)
class Fetched:
    """An image URL's bytes, as the cache holds them for the freshness window."""

    data: bytes
    mime_type: str
    fetched_at: float

    @property
    def nbytes(self) -> int:
        return len(self.data)


@final
@dataclasses.dataclass(frozen=True, slots=True)
class Wanted:
    """What a URL's answer must be: one of its media types, at most its bytes."""

    what: str  # "image" or "video": a refusal's word, and the fetch's own cache entry
    mime_types: tuple[str, ...]
    max_bytes: int
    described: str  # as a refusal names what was wanted


@final
class ImageFetcher:
    def __init__(self, settings: MediaSettings, cache: CacheFront) -> None:
        self.settings = settings
        self.cache = cache
        self.images = Wanted(
            "image", MIME_TYPES, settings.max_image_bytes, "a PNG, JPEG or WebP image"
        )
        self.videos = Wanted(
            "video", VIDEO_MIME_TYPES, settings.max_video_bytes, "an MP4, WebM or AVI video"
        )
        self.resolver: Resolver = system_resolver
        self.stats = FetchStats()
        self._allowed_hosts = {e for e in settings.url_allow if not _is_network(e)}
        self._allowed_networks = [
            ipaddress.ip_network(e, strict=False) for e in settings.url_allow if _is_network(e)
        ]
        verify: ssl.SSLContext | bool = True
        if settings.url_ca_file is not None:
            verify = ssl.create_default_context(cafile=str(settings.url_ca_file))
        # no redirects of its own (each hop is checked here), no proxies from the environment,
        # and no connection kept: a pooled one is keyed by the address, and reusing it for
        # another name at that address would skip the check of that name's certificate
        self._client = httpx.AsyncClient(
            verify=verify,
            follow_redirects=False,
            trust_env=False,
            http2=False,
            limits=httpx.Limits(max_keepalive_connections=0),
        )

    async def aclose(self) -> None:
        await self._client.aclose()

    async def forget(self, url: str, tenant: str, wanted: Wanted | None = None) -> None:
        """Drop a URL's fetched bytes (they were no image): the next request fetches again."""
        await self.cache.invalidate(_key(url, wanted or self.images), tenant=tenant, local=True)

    async def fetch(
        self, index: int, url: str, call: MediaCall, wanted: Wanted | None = None
    ) -> Fetched:
        """The URL's bytes: from a fetch shared by the call's tenant's concurrent requests, or one
        made in the last url_fresh_seconds; waited for until the call's deadline. ``wanted``:
        what the answer must be (None: an image)."""
        wanted = wanted or self.images
        key, tenant = _key(url, wanted), call.tenant
        for _ in range(2):
            try:
                lookup = await self.cache.get(
                    key,
                    # no deadline of its own: the leader's would fail the followers who
                    # wait longer; the waiters' deadlines bound it (see the module's doc)
                    lambda: self._fetch(index, url, wanted),
                    tenant=tenant,
                    timeout=max(call.left(), 0.001),
                    tier=Stage.FETCH.tier_use,
                    cancel_when_orphaned=True,
                )
            except (UrlNotAllowed, ImageFetchFailed) as failed:
                # a fetch another request started names its image: this one names its own
                raise failed.at(index) from None
            except ComputeTimeout:
                # this caller's deadline (or the flight's compute deadline) passed first
                self.stats.outcomes["timeout"] += 1
                raise ImageFetchFailed(
                    index, "timeout", "the fetch outlived the deadline"
                ) from None
            outcome, _ = outcome_of(lookup)
            fetched: Fetched = lookup.value
            if outcome != Outcome.HIT.value:
                self.stats.outcomes[outcome] += 1
                return fetched
            if time.monotonic() - fetched.fetched_at <= self.settings.url_fresh_seconds:
                self.stats.outcomes["hit"] += 1
                return fetched
            # stale: fetched anew (the next lookup is a miss, or joins another's refetch)
            await self.cache.invalidate(key, tenant=tenant, local=True)
        return fetched

    # ── one fetch ───────────────────────────────────────────────────────────────────────────

    async def _fetch(self, index: int, url: str, wanted: Wanted) -> Fetched:
        """One fetch, as a flight's computation: cancelled when nobody waits for it any more
        (the actor does it), or by its one caller's deadline where the cache is bypassed."""
        started = time.perf_counter()
        host = "" if url_problem(url) else urlsplit(url).hostname or ""
        data, mime, status = b"", "", 0
        failure: UrlNotAllowed | ImageFetchFailed | None = None
        with span("media.fetch", {"mmgate.fetch.host": host}) as traced:
            try:
                data, mime, status = await self._follow(index, url, wanted)
                outcome = "fetched"
            except asyncio.CancelledError:
                # nobody waits any more (every waiter left, or its one caller where the cache is
                # bypassed), or the flight's compute deadline passed: the connection is closed
                # (_follow's finally) and the span says why the fetch ended
                if traced is not None:
                    traced.set_attribute("mmgate.fetch.outcome", "cancelled")
                raise
            except UrlNotAllowed as refused:
                outcome, failure = "refused", refused
            except ImageFetchFailed as failed:
                outcome = "timeout" if failed.kind == "timeout" else "failed"
                failure, status = failed, failed.upstream_status
            if traced is not None:
                traced.set_attribute("mmgate.fetch.outcome", outcome)
                traced.set_attribute("mmgate.fetch.status", status)
                traced.set_attribute("mmgate.fetch.bytes", len(data))
            if failure is not None:
                self.stats.outcomes[outcome] += 1
                raise failure  # in the span: its status says ERROR
        self.stats.observe(time.perf_counter() - started, len(data))
        return Fetched(data, mime, time.monotonic())

    async def _follow(self, index: int, url: str, wanted: Wanted) -> tuple[bytes, str, int]:
        settings = self.settings
        for hop in range(settings.url_max_redirects + 1):
            host, pinned = await self._checked(index, url, _whose(hop))
            parts = urlsplit(url)
            request = self._request(index, hop, pinned, parts.netloc, host, wanted)
            try:
                response = await self._client.send(request, stream=True)
                try:
                    if response.status_code in _REDIRECTS and "location" in response.headers:
                        url = _joined(index, url, response.headers["location"])
                        continue
                    body = await self._body(index, response, wanted)
                    return body, _mime(response), response.status_code
                finally:
                    await response.aclose()
            except httpx.InvalidURL:
                # httpx reads a redirect's Location as it answers, before this code sees it
                raise UrlNotAllowed(index, "url", "a redirect's URL is not valid") from None
            except httpx.RemoteProtocolError as error:
                if "location header" in str(error).lower():
                    raise UrlNotAllowed(index, "url", "a redirect's URL is not valid") from None
                raise ImageFetchFailed(
                    index, "unavailable", f"could not fetch from {host}: {_what(error)}"
                ) from None
            except httpx.HTTPError as error:
                kind = "timeout" if isinstance(error, httpx.TimeoutException) else "unavailable"
                raise ImageFetchFailed(
                    index, kind, f"could not fetch from {host}: {_what(error)}"
                ) from None
        raise UrlNotAllowed(index, "redirects", f"more than {settings.url_max_redirects} redirects")

    def collect(self) -> Iterator[Metric]:
        """Images by URL: fetched, coalesced, refused... (metrics.py)."""
        return fetch_families(self.stats.copy())

    def _request(
        self, index: int, hop: int, pinned: str, netloc: str, host: str, wanted: Wanted
    ) -> httpx.Request:
        settings = self.settings
        try:
            return self._client.build_request(
                "GET",
                pinned,
                # media is compressed already: an answer compressed again is refused, so
                # nothing here inflates what a server sends (no compression bomb)
                headers={
                    "Host": netloc,
                    "Accept": ", ".join(wanted.mime_types),
                    "Accept-Encoding": "identity",
                },
                # TLS is checked against the host name, on the connection to the checked address
                extensions={"sni_hostname": host},
                timeout=httpx.Timeout(
                    settings.url_read_timeout_seconds, connect=settings.url_connect_timeout_seconds
                ),
            )
        except httpx.InvalidURL:
            raise UrlNotAllowed(index, "url", f"{_whose(hop)} URL is not valid") from None

    async def _checked(self, index: int, url: str, whose: str) -> tuple[str, str]:
        """(host, the URL with the checked address in place of the host); ``whose``: "the"
        URL's host or "a redirect's", as a refusal says (never naming the host or address)."""
        problem = url_problem(url)
        if problem is not None:
            raise UrlNotAllowed(index, "url", f"{whose} URL is {problem}")
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme not in self.settings.url_schemes:
            allowed = ", ".join(self.settings.url_schemes)
            raise UrlNotAllowed(index, "scheme", f"{scheme or 'no'} scheme; allowed: {allowed}")
        if parts.username is not None or parts.password is not None:
            raise UrlNotAllowed(index, "credentials", "credentials in an image URL")
        host = (parts.hostname or "").lower()
        if not host:
            raise UrlNotAllowed(index, "host", "no host")
        try:
            port = parts.port or (443 if scheme == "https" else 80)
        except ValueError:
            raise UrlNotAllowed(index, "host", "not a valid port") from None
        address = await self._address(index, host, port)
        if host not in self._allowed_hosts and not any(
            address in network for network in self._allowed_networks
        ):
            kind = refused_kind(address)
            if kind is not None:
                raise UrlNotAllowed(
                    index, "address", f"{whose} host is a {kind} address (MMGATE_MEDIA__URL_ALLOW)"
                )
        literal = f"[{address}]" if address.version == 6 else str(address)
        pinned = parts._replace(netloc=f"{literal}:{port}").geturl()
        return host, pinned

    async def _address(self, index: int, host: str, port: int) -> Address:
        """The one address a host is reached at: resolved once, here."""
        try:
            return ipaddress.ip_address(host.strip("[]"))  # a literal: nothing to resolve
        except ValueError:
            pass
        try:
            resolved = await self.resolver(host, port)
        except OSError:
            resolved = []
        if not resolved:
            raise ImageFetchFailed(index, "unavailable", f"{host} does not resolve")
        return ipaddress.ip_address(resolved[0].split("%", 1)[0])

    async def _body(self, index: int, response: httpx.Response, wanted: Wanted) -> bytes:
        status = response.status_code
        what = wanted.what
        if status != 200:
            kind = "unavailable" if status >= 500 else "refused"
            raise ImageFetchFailed(index, kind, f"the {what} URL answered {status}", status)
        if _mime(response) not in wanted.mime_types:
            raise ImageFetchFailed(
                index, "refused", f"the {what} URL's answer is not {wanted.described}", status
            )
        encoding = response.headers.get("content-encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            raise ImageFetchFailed(index, "refused", "a compressed answer was refused", status)
        cap = wanted.max_bytes
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > cap:
            raise ImageFetchFailed(index, "refused", f"over {cap} bytes", status)
        body = bytearray()
        # counted as it comes: a body longer than it said (or than the cap) stops at the cap
        async for chunk in response.aiter_raw(_CHUNK):
            body += chunk
            if len(body) > cap:
                raise ImageFetchFailed(index, "refused", f"over {cap} bytes", status)
        return bytes(body)


def _whose(hop: int) -> str:
    return "a redirect's" if hop else "the"


def _joined(index: int, url: str, location: str) -> str:
    """Where a redirect leads; one that does not parse is refused in mmgate's words."""
    try:
        return urljoin(url, location)
    except ValueError:
        raise UrlNotAllowed(index, "url", "a redirect's URL is not valid") from None


def _key(url: str, wanted: Wanted) -> str:
    """A URL's fetched bytes in the cache: the same for every model (they are the bytes), one
    entry for each kind of media (each is checked against its own types and size)."""
    if wanted.what == "image":
        return cache_key("url", Stage.FETCH, {"url": url})
    return cache_key("url", Stage.FETCH, {"url": url, "what": wanted.what})


def _is_network(entry: str) -> bool:
    try:
        ipaddress.ip_network(entry, strict=False)
    except ValueError:
        return False
    return True


def _mime(response: httpx.Response) -> str:
    declared: str = response.headers.get("content-type", "")
    return declared.split(";", 1)[0].strip().lower()


def _what(error: httpx.HTTPError) -> str:
    """An error's kind in mmgate's words (no addresses, no class names)."""
    if isinstance(error, httpx.TimeoutException):
        return "timed out"
    if isinstance(error, httpx.ConnectError):
        return "connection failed"
    return "the connection broke"


__all__ = ["Fetched", "ImageFetcher", "Wanted", "refused_kind", "url_problem"]
