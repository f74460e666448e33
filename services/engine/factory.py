"""The engine a server builds unless it is handed a factory: the one its settings name."""

from __future__ import annotations

from ..config import Settings
from .protocol import ServedEngine
from .synthetic_engine import SyntheticEngine
from .worker import vllm_engine


def configured_engine(settings: Settings) -> ServedEngine:
    """vLLM; the synthetic engine where ``engine.synthetic`` is set (load tests only)."""
    if settings.engine.synthetic is not None:
        return SyntheticEngine(settings)
    return vllm_engine(settings)


__all__ = ["configured_engine"]
