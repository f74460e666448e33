"""OpenTelemetry traces for mmgate (placeholder interface; being written)."""

from __future__ import annotations

from typing import Any, final

from cache_actor import LookupHook

from .config import Settings


@final
class Tracing:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.enabled = False
        self.lookup_hook: LookupHook | None = None

    def server_interceptors(self) -> list[Any]:
        return []

    async def shutdown(self) -> None:
        return None
