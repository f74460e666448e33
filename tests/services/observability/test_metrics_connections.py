"""/metrics under idle and half-open connections: they cost no thread each, are closed after the
read timeout, and a scrape meanwhile is answered."""

from __future__ import annotations

import asyncio
import socket
import urllib.parse

import psutil

from tests.support import RunningServer

from ..prom import scrape

IDLE_CONNECTIONS = 200
# the metrics server's own threads (its loop and its rendering pool), whatever the connections
MAX_EXTRA_THREADS = 4


def threads(server: RunningServer) -> int:
    return int(psutil.Process(server.process.pid).num_threads())


async def test_half_open_connections_cost_no_threads(server: RunningServer) -> None:
    await scrape(server.metrics_url)  # the server's threads all started
    before = threads(server)
    address = urllib.parse.urlsplit(server.metrics_url)
    sockets: list[socket.socket] = []
    try:
        for index in range(IDLE_CONNECTIONS):
            sock = socket.create_connection((address.hostname, address.port), timeout=10)
            # half of them send half a request and stop; the rest send nothing at all
            if index % 2:
                sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
            sockets.append(sock)
        # answered while all of them hang
        assert (await scrape(server.metrics_url)).value("mmgate_engine_ready") == 1
        assert threads(server) <= before + MAX_EXTRA_THREADS, (before, threads(server))

        # each is closed by the server once its read timeout (2 s here) is over
        def closed(sock: socket.socket) -> bool:
            try:
                return sock.recv(1) == b""
            except ConnectionResetError:
                return True

        for sock in sockets:
            sock.settimeout(30)
        outcomes = await asyncio.gather(*(asyncio.to_thread(closed, s) for s in sockets[:20]))
        assert all(outcomes)
    finally:
        for sock in sockets:
            sock.close()
