"""Real HTTPS servers on loopback addresses for images by URL: each answers its routes from a
thread of its own (http.server over TLS, a certificate of the test CA for its names; plain HTTP
where it is given no certificate) and counts
every request it gets, so a test can tell that a host was never contacted."""

from __future__ import annotations

import http.server
import ssl
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tests.tls_support import Issued

# what a route does with a request: status, headers, body (bytes, or chunks written one by one)
Answer = tuple[int, dict[str, str], bytes | list[bytes]]
Route = Callable[[], Answer]


@dataclass
class ImageHost:
    address: str  # a loopback address of its own: 127.0.0.2, 127.0.0.3
    cert: Issued | None  # None: plain HTTP
    routes: dict[str, Route]

    def __post_init__(self) -> None:
        self.hits: Counter[str] = Counter()
        self.lock = threading.Lock()
        host = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                with host.lock:
                    host.hits[self.path] += 1
                route = host.routes.get(self.path)
                status, headers, body = route() if route else (404, {}, b"not here")
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                if isinstance(body, bytes):
                    if "Content-Length" not in headers:
                        self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                self.send_header("Connection", "close")  # no length: the body ends with it
                self.end_headers()
                try:
                    for chunk in body:
                        self.wfile.write(chunk)
                except OSError:
                    pass  # the client stopped reading: what a cap does
                self.close_connection = True

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer((self.address, 0), Handler)
        self.server.daemon_threads = True
        if self.cert is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(str(self.cert.cert), str(self.cert.key))
            self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str, name: str) -> str:
        scheme = "http" if self.cert is None else "https"
        return f"{scheme}://{name}:{self.port}{path}"

    @property
    def requests(self) -> int:
        with self.lock:
            return sum(self.hits.values())

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def image(data: bytes, mime: str = "image/png", delay: float = 0.0) -> Route:
    def answer() -> Answer:
        time.sleep(delay)  # a slow origin: concurrent requests for it meet in one fetch
        return 200, {"Content-Type": mime}, data

    return answer


def redirect(location: str) -> Route:
    return lambda: (302, {"Location": location}, b"")


__all__ = ["Answer", "ImageHost", "Route", "image", "redirect"]
