"""Prometheus metrics for mmgate (placeholder interface; being written)."""

from __future__ import annotations

from typing import Any, final

from cache_actor import LookupHook

from .config import Settings


@final
class Metrics:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.lookup_hook: LookupHook | None = None
        self.port = 0

    def server_interceptors(self) -> list[Any]:
        return []

    def bind(self, server: Any) -> None:
        """Read the server's cache, engine, media pipeline and servicers at each scrape."""

    def start(self) -> None:
        """Serve /metrics on settings.metrics.host:port (sets self.port)."""

    def stop(self) -> None:
        return None
