"""/metrics over HTTP, bounded: one thread and its own event loop for every connection, a small
pool for rendering, a read timeout, a cap on connections waiting to send their request.

    connection ──▶ metrics thread's loop: read the request head (READ_TIMEOUT) ──▶ GET /metrics?
        ──▶ render in the pool (prometheus_client.generate_latest, the encoder the client accepts)
        ──▶ one response, then close

prometheus_client's own server starts a thread per connection and waits on a silent client
forever (200 half-open connections made 219 threads). Here an idle connection costs a socket and a
coroutine until its read timeout closes it, and beyond ``max_connections`` such connections the
longest-idle is closed to make room (so silent clients cannot lock a scrape out). The server's
loop is not mmgate's: a stuck service loop still gets a scrape answered (the collector says what
it could not read, metrics.py).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
from collections.abc import Callable
from typing import final

from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import CollectorRegistry

log = logging.getLogger("mmgate.metrics")

# the request head: a request line and a few headers; anything longer is not a scrape
MAX_HEAD_BYTES = 16 * 1024
RENDER_THREADS = 2
START_TIMEOUT_SECONDS = 10.0


def _response(status: str, content_type: str, body: bytes) -> bytes:
    head = (
        f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


@final
class MetricsHTTPServer:
    """Serves ``registry`` at /metrics on ``host:port`` from a thread of its own."""

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        read_timeout: float,
        max_connections: int,
    ) -> None:
        self.registry = registry
        self.read_timeout = read_timeout
        self.max_connections = max_connections
        self.port = 0
        # connections still sending their request head, oldest first
        self._reading: dict[asyncio.StreamWriter, None] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stop: asyncio.Event | None = None
        self._render = concurrent.futures.ThreadPoolExecutor(
            RENDER_THREADS, thread_name_prefix="mmgate-metrics-render"
        )

    def start(self, host: str, port: int) -> None:
        """Listen and serve; returns once the port is open (sets self.port)."""
        ready: concurrent.futures.Future[int] = concurrent.futures.Future()
        self._thread = threading.Thread(
            target=self._run, args=(host, port, ready), name="mmgate-metrics", daemon=True
        )
        self._thread.start()
        self.port = ready.result(timeout=START_TIMEOUT_SECONDS)

    def stop(self) -> None:
        loop, stop, thread = self._loop, self._stop, self._thread
        if loop is not None and stop is not None:
            with contextlib.suppress(RuntimeError):  # its loop has already closed
                loop.call_soon_threadsafe(stop.set)
        if thread is not None:
            thread.join(timeout=5)
        self._render.shutdown(wait=False, cancel_futures=True)

    def _run(self, host: str, port: int, ready: concurrent.futures.Future[int]) -> None:
        try:
            asyncio.run(self._serve(host, port, ready))
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc)
            else:
                log.exception("the metrics server stopped")

    async def _serve(self, host: str, port: int, ready: concurrent.futures.Future[int]) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        server = await asyncio.start_server(self._connection, host, port, limit=MAX_HEAD_BYTES)
        ready.set_result(server.sockets[0].getsockname()[1])
        async with server:
            await self._stop.wait()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self._reading) >= self.max_connections:
            # the longest-idle connection makes room (its read ends): silent clients cannot
            # lock a scrape out
            oldest = next(iter(self._reading))
            del self._reading[oldest]
            oldest.close()
        self._reading[writer] = None
        try:
            async with asyncio.timeout(self.read_timeout):
                head = await reader.readuntil(b"\r\n\r\n")
            self._reading.pop(writer, None)
            # rendering is bounded by the collector's own wait for a snapshot (metrics.py)
            writer.write(await self._answer(head))
            async with asyncio.timeout(self.read_timeout):  # a client that reads nothing
                await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass  # a silent, slow or oversized client: closed without an answer
        except ConnectionError:
            pass
        finally:
            self._reading.pop(writer, None)
            writer.close()

    async def _answer(self, head: bytes) -> bytes:
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or parts[0] not in ("GET", "HEAD"):
            return _response("405 Method Not Allowed", "text/plain", b"GET /metrics\n")
        if parts[1].split("?", 1)[0] not in ("/metrics", "/"):
            return _response("404 Not Found", "text/plain", b"see /metrics\n")
        accept = ""
        for line in lines[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "accept":
                accept = value.strip()
        encoder, content_type = choose_encoder(accept)
        render: Callable[[], bytes] = lambda: encoder(self.registry)  # noqa: E731
        body = await asyncio.get_running_loop().run_in_executor(self._render, render)
        return _response("200 OK", content_type, b"" if parts[0] == "HEAD" else body)


__all__ = ["MetricsHTTPServer"]
