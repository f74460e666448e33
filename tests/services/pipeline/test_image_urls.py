"""Images by URL on the session's in-process server (the tiny LLaVA, embeddings mode): real HTTPS
servers on loopback, the allowed one on 127.0.0.2 (the only address allow-listed), an internal
one on 127.0.0.3; the names they answer to map to their addresses through a resolver the test
hands the server's fetcher (the one injection: nothing else is faked).

One fetch for sixteen requests at once; a shared fetch lasting to its longest waiter's deadline,
not its leader's, and stopping (its connection closed, nothing stored) once nobody waits; every
refusal of the guard (a redirect to loopback or to
the metadata address, a name resolving to a private or internal address, http, credentials)
without the internal server ever contacted; every failing fetch (too large with or without a
length, compressed, an image bomb, a stall past the deadline, a 404, not an image) its own
status, nothing stored, and the server serving the next request."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import grpc
import pytest
import pytest_asyncio
from google.rpc.error_details_pb2 import ErrorInfo

from services.api.server import MmgateServer
from services.client import MmgateClient, build_request, digest_of, error_reason
from services.keys import cache_key
from services.pipeline.media import EmbeddingsStage
from tests.services.image_hosts import Answer, ImageHost, image, redirect
from tests.services.statuses import error_details
from tests.support import eventually
from tests.tls_support import Issued

from ..imagegen import png, png_bomb

pytestmark = pytest.mark.asyncio(loop_scope="session")

ADDRESSES = {
    "images.test": "127.0.0.2",
    "internal.test": "127.0.0.3",
    "private.test": "10.1.2.3",
    "impostor.test": "127.0.0.2",  # the same address, a name its certificate does not carry
}
CAT = png(3101)
MiB = 2**20


async def resolve(host: str, port: int) -> list[str]:
    if host in ADDRESSES:
        return [ADDRESSES[host]]
    raise OSError(f"{host} does not resolve here")


@pytest.fixture(scope="module")
def gate() -> threading.Event:
    return threading.Event()


@dataclass
class Held:
    """What the slow routes wait on, and what they tell: threads of the host, so threading's."""

    slow: threading.Event = field(default_factory=threading.Event)  # /slow.png answers
    stop: threading.Event = field(default_factory=threading.Event)  # /drip-*.png end
    # a /drip-*.png answer ended: its client closed the connection (or the module ended)
    drip_closed: threading.Event = field(default_factory=threading.Event)


@pytest.fixture(scope="module")
def held() -> Held:
    return Held()


@pytest.fixture(scope="module")
def hosts(
    image_hosts_cert: tuple[Path, Issued], gate: threading.Event, held: Held
) -> Iterator[tuple[ImageHost, ImageHost]]:
    cert = image_hosts_cert[1]
    internal = ImageHost("127.0.0.3", cert, {"/secret.png": image(CAT)})

    def held_back() -> Answer:
        gate.wait(timeout=30)  # until all sixteen requests wait on the one fetch
        return 200, {"Content-Type": "image/png"}, png(3102)

    def endless() -> Answer:
        return 200, {"Content-Type": "image/png"}, [b"\x89PNG" + b"\0" * 65536] * 400

    def lying() -> Answer:  # says 20 bytes, sends 11 MiB: only what it said is read
        return 200, {"Content-Type": "image/png", "Content-Length": "20"}, b"\0" * (11 * MiB)

    def stalled() -> Answer:
        gate_stall.wait(timeout=30)
        return 200, {"Content-Type": "image/png"}, CAT

    def slow() -> Answer:
        held.slow.wait(timeout=30)  # until its first caller's deadline has passed
        return 200, {"Content-Type": "image/png"}, png(3105)

    def drip() -> Answer:
        """An image that never ends: a KiB at a time until its client hangs up."""

        def chunks() -> Iterator[bytes]:
            try:
                yield b"\x89PNG\r\n\x1a\n"
                while not held.stop.wait(0.02):  # the drip's pace, not the test's sequence
                    yield b"\0" * 1024
            finally:  # the host's write failed (the connection is closed) or the module ended
                held.drip_closed.set()

        # the host writes the chunks as it iterates them: a generator drips them
        return 200, {"Content-Type": "image/png"}, cast(list[bytes], chunks())

    gate_stall = threading.Event()
    allowed = ImageHost(
        "127.0.0.2",
        cert,
        {
            "/cat.png": image(CAT),
            "/first.png": image(png(3103)),
            "/second.png": image(png(3104)),
            "/shared.png": held_back,
            "/to-loopback": redirect(f"https://internal.test:{internal.port}/secret.png"),
            "/to-metadata": redirect("http://169.254.169.254/latest/meta-data/"),
            "/to-metadata-https": redirect("https://169.254.169.254/latest/meta-data/"),
            "/to-127.0.0.1": redirect(f"https://127.0.0.1:{internal.port}/secret.png"),
            "/to-internal-ip": redirect(f"https://127.0.0.3:{internal.port}/secret.png"),
            # redirects that do not parse: once INTERNAL "internal error: ValueError" with a
            # traceback in the log
            "/to-unclosed-ipv6": redirect("https://[::1/x.png"),
            "/to-empty-label": redirect("https://a..b/x.png"),
            "/to-backslashes": redirect(f"http:\\\\127.0.0.3:{internal.port}/secret.png"),
            "/large-unsaid.png": endless,
            "/large-said.png": lambda: (
                200,
                {"Content-Type": "image/png", "Content-Length": str(11 * MiB)},
                [b"\0" * MiB] * 11,
            ),
            "/lying.png": lying,
            "/gzip.png": lambda: (
                200,
                {"Content-Type": "image/png", "Content-Encoding": "gzip"},
                b"\x1f\x8b" + b"\0" * 100,
            ),
            "/bomb.png": image(png_bomb()),
            "/stall.png": stalled,
            "/slow.png": slow,
            "/drip-cancelled.png": drip,
            "/drip-deadline.png": drip,
            "/page.html": lambda: (200, {"Content-Type": "text/html"}, b"<html></html>"),
        },
    )
    yield allowed, internal
    gate.set()
    gate_stall.set()
    held.slow.set()
    held.stop.set()
    allowed.stop()
    internal.stop()


@pytest.fixture
def server(embeddings_server: MmgateServer) -> MmgateServer:
    stage = embeddings_server.pipelines.get().media
    assert isinstance(stage, EmbeddingsStage)
    embeddings_server.fetcher.resolver = resolve
    return embeddings_server


@pytest_asyncio.fixture(loop_scope="session")
async def client(server: MmgateServer) -> AsyncIterator[MmgateClient]:
    async with MmgateClient(f"127.0.0.1:{server.port}", timeout=60.0) as client:
        yield client


def ask(url: str) -> object:
    return build_request("What is in the picture?", images=[url], max_tokens=4, temperature=0.0)


async def refusal(client: MmgateClient, url: str, timeout: float = 30.0) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await client.complete_request(ask(url), timeout=timeout)  # type: ignore[arg-type]
    return refused.value


async def test_sixteen_requests_for_one_url_share_one_fetch(
    server: MmgateServer,
    client: MmgateClient,
    hosts: tuple[ImageHost, ImageHost],
    gate: threading.Event,
) -> None:
    allowed, _ = hosts
    url = allowed.url("/shared.png", "images.test")
    stage = server.pipelines.get().media
    assert isinstance(stage, EmbeddingsStage)
    before = dict(server.fetcher.stats.outcomes)
    calls = [
        asyncio.ensure_future(client.complete_request(ask(url)))  # type: ignore[arg-type]
        for _ in range(16)
    ]
    # all sixteen wait on the one fetch the first one started, then the origin answers
    for _ in range(600):
        if server.cache.stats().waiters >= 16:
            break
        await asyncio.sleep(0.05)
    gate.set()
    answers = await asyncio.gather(*calls)
    assert allowed.hits["/shared.png"] == 1
    after = server.fetcher.stats.outcomes
    assert after["miss"] - before.get("miss", 0) == 1
    assert after["coalesced"] - before.get("coalesced", 0) == 15
    assert len({tuple(a.token_ids) for a in answers}) == 1
    # the report names the bytes: a caller can send the digest next time
    assert {a.final.cache.images[0].digest for a in answers} == {digest_of(png(3102))}


async def test_a_shared_fetch_lasts_to_its_longest_waiter_not_its_leader(
    server: MmgateServer, client: MmgateClient, hosts: tuple[ImageHost, ImageHost], held: Held
) -> None:
    """The request that started a fetch leaves at its short deadline; one that joined it with a
    long deadline still gets the image, from the same fetch (once "the fetch outlived the
    deadline" at the leader's deadline, for both)."""
    allowed, _ = hosts
    url = allowed.url("/slow.png", "images.test")
    stage = server.pipelines.get().media
    assert isinstance(stage, EmbeddingsStage)
    before = dict(server.fetcher.stats.outcomes)
    leader = asyncio.ensure_future(client.complete_request(ask(url), timeout=2.5))  # type: ignore[arg-type]

    async def fetching() -> bool:
        return allowed.hits["/slow.png"] == 1

    await eventually(fetching, timeout=10.0)
    follower = asyncio.ensure_future(client.complete_request(ask(url), timeout=60.0))  # type: ignore[arg-type]

    async def joined() -> bool:
        return server.cache.stats().waiters == 2

    await eventually(joined, timeout=2.0)
    with pytest.raises(grpc.aio.AioRpcError) as late:
        await leader
    assert late.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED

    async def left() -> bool:  # the server's side of the leader gave up too: its deadline is
        return server.cache.stats().waiters == 1  # its own, a little after the client's

    await eventually(left, timeout=5.0)
    held.slow.set()  # the host answers only now, past the leader's deadline
    answer = await follower
    assert answer.final.cache.images[0].digest == digest_of(png(3105))
    assert allowed.hits["/slow.png"] == 1
    after = server.fetcher.stats.outcomes
    assert after["miss"] - before.get("miss", 0) == 0  # the leader never got the bytes
    assert after["coalesced"] - before.get("coalesced", 0) == 1


@pytest.mark.parametrize("leaves", ["cancelled", "deadline"])
async def test_a_fetch_nobody_waits_for_stops_and_stores_nothing(
    server: MmgateServer,
    client: MmgateClient,
    hosts: tuple[ImageHost, ImageHost],
    held: Held,
    leaves: str,
) -> None:
    """Its only caller cancels (or its deadline passes) while the host is still sending: the
    fetch stops at once, the host sees its connection closed, and nothing is stored (once it
    went on to the caller's deadline, holding the connection, and stored the bytes for
    nobody)."""
    allowed, _ = hosts
    path = f"/drip-{leaves}.png"
    url = allowed.url(path, "images.test")
    key = cache_key("url", "fetch", {"url": url})
    held.drip_closed.clear()
    call = asyncio.ensure_future(
        client.complete_request(ask(url), timeout=60.0 if leaves == "cancelled" else 2.0)  # type: ignore[arg-type]
    )

    async def dripping() -> bool:
        return allowed.hits[path] == 1 and (await server.cache.inspect(key)).state == "in_flight"

    await eventually(dripping, timeout=10.0)
    assert not held.drip_closed.is_set()
    if leaves == "cancelled":
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
    else:
        with pytest.raises(grpc.aio.AioRpcError) as late:
            await call
        assert late.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED

    async def hung_up() -> bool:
        return held.drip_closed.is_set()

    await eventually(hung_up, timeout=5.0)

    async def settled() -> bool:
        return (await server.cache.inspect(key)).state == "absent"

    await eventually(settled, timeout=5.0)
    assert server.cache.stats().flights == 0
    assert allowed.hits[path] == 1


async def test_a_url_and_its_bytes_answer_alike(
    client: MmgateClient, hosts: tuple[ImageHost, ImageHost]
) -> None:
    allowed, _ = hosts
    by_url = await client.complete_request(ask(allowed.url("/cat.png", "images.test")))  # type: ignore[arg-type]
    by_bytes = await client.complete_request(
        build_request("What is in the picture?", images=[CAT], max_tokens=4, temperature=0.0)
    )
    assert by_url.token_ids == by_bytes.token_ids
    assert by_url.final.cache.images[0].digest == digest_of(CAT)


@pytest.mark.parametrize(
    ("target", "rule"),
    [
        ("/to-loopback", "address"),  # a redirect to a name resolving to 127.0.0.3
        ("/to-metadata", "scheme"),  # http, and the metadata address behind it
        ("/to-metadata-https", "address"),
        ("/to-127.0.0.1", "address"),
        ("/to-internal-ip", "address"),
        ("/to-unclosed-ipv6", "url"),
        ("/to-empty-label", "url"),
        ("/to-backslashes", "url"),
        ("internal", "address"),  # a name that resolves to the internal host
        ("private", "address"),  # a name that resolves to a private address
        ("http", "scheme"),
        ("credentials", "credentials"),
        ("metadata-https", "address"),
    ],
)
async def test_the_guard_refuses_and_the_internal_host_is_never_contacted(
    client: MmgateClient, hosts: tuple[ImageHost, ImageHost], target: str, rule: str
) -> None:
    allowed, internal = hosts
    urls = {
        "internal": internal.url("/secret.png", "internal.test"),
        "private": f"https://private.test:{allowed.port}/cat.png",
        "http": f"http://images.test:{allowed.port}/cat.png",
        "credentials": f"https://user:secret@images.test:{allowed.port}/cat.png",
        "metadata-https": "https://169.254.169.254/latest/meta-data/",
    }
    url = urls.get(target) or allowed.url(target, "images.test")
    error = await refusal(client, url)
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED, error.details()
    assert error_reason(error) == "URL_NOT_ALLOWED"
    details = error.details() or ""
    assert f"rule: {rule}" in details
    for secret in ("127.0.0.3", "10.1.2.3", "169.254", "secret"):
        assert secret not in details, details
    assert internal.requests == 0
    # and the server serves the next request
    assert (await client.complete_request(ask(allowed.url("/cat.png", "images.test")))).token_ids  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("path", "code", "upstream"),
    [
        ("/large-unsaid.png", grpc.StatusCode.FAILED_PRECONDITION, "200"),
        ("/large-said.png", grpc.StatusCode.FAILED_PRECONDITION, "200"),
        ("/gzip.png", grpc.StatusCode.FAILED_PRECONDITION, "200"),
        ("/missing.png", grpc.StatusCode.FAILED_PRECONDITION, "404"),
        ("/page.html", grpc.StatusCode.FAILED_PRECONDITION, "200"),
        ("/stall.png", grpc.StatusCode.DEADLINE_EXCEEDED, "0"),
    ],
)
async def test_a_failing_fetch_gets_its_status_and_leaves_nothing(
    server: MmgateServer,
    client: MmgateClient,
    hosts: tuple[ImageHost, ImageHost],
    path: str,
    code: grpc.StatusCode,
    upstream: str,
) -> None:
    allowed, _ = hosts
    url = allowed.url(path, "images.test")
    error = await refusal(client, url, timeout=3.0)
    assert error.code() == code, error.details()
    if code != grpc.StatusCode.DEADLINE_EXCEEDED or error_reason(error):
        assert error_reason(error) == "IMAGE_FETCH_FAILED"
        (info,) = [d for d in error_details(error) if isinstance(d, ErrorInfo)]
        assert info.metadata["upstream_status"] == upstream
    assert "<html>" not in (error.details() or "")
    # nothing stored, and a fetch past its deadline does not go on for nobody: the next
    # request for the URL fetches it again
    key = cache_key("url", "fetch", {"url": url})

    async def settled() -> bool:
        return (await server.cache.inspect(key)).state != "in_flight"

    await eventually(settled, timeout=5.0)
    assert (await server.cache.inspect(key)).state == "absent"
    assert (await client.complete_request(ask(allowed.url("/cat.png", "images.test")))).token_ids  # type: ignore[arg-type]


@pytest.mark.parametrize("path", ["/lying.png", "/bomb.png"])
async def test_bytes_that_are_no_image_are_refused_by_the_decoder(
    server: MmgateServer, client: MmgateClient, hosts: tuple[ImageHost, ImageHost], path: str
) -> None:
    allowed, _ = hosts
    url = allowed.url(path, "images.test")
    error = await refusal(client, url)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    # not kept for the URL either: the next request fetches it again
    assert (await server.cache.inspect(cache_key("url", "fetch", {"url": url}))).state == "absent"


async def test_the_command_line_sends_an_image_url(
    server: MmgateServer, hosts: tuple[ImageHost, ImageHost]
) -> None:
    allowed, _ = hosts
    done = await asyncio.to_thread(
        subprocess.run,
        [
            sys.executable,
            "-m",
            "services.cli",
            "generate",
            "What is in the picture?",
            "--image-url",
            allowed.url("/cat.png", "images.test"),
            "--max-tokens",
            "4",
            "--target",
            f"127.0.0.1:{server.port}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip()


async def test_a_name_is_checked_against_its_certificate_on_every_fetch(
    client: MmgateClient, hosts: tuple[ImageHost, ImageHost]
) -> None:
    """A connection to an address is never reused for another name at that address: the
    second name's certificate is checked (here it has none), not the first's."""
    allowed, _ = hosts
    assert (await client.complete_request(ask(allowed.url("/first.png", "images.test")))).token_ids  # type: ignore[arg-type]
    error = await refusal(client, allowed.url("/second.png", "impostor.test"))
    assert error.code() == grpc.StatusCode.UNAVAILABLE, error.details()
    assert error_reason(error) == "IMAGE_FETCH_FAILED"
    assert allowed.hits["/second.png"] == 0
