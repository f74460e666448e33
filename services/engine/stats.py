"""The engine's own counts: a vLLM stat logger that adds each engine step into plain counters.

    vLLM's output handler ── record(scheduler stats, iteration stats) ──▶ _StatsRecorder
        ──▶ Counters (prefix cache, requests, queue) and TokenCounters (tokens, TTFT)
        ──▶ Progress.stepped() (the engine watchdog's heartbeat, progress.py)
        ──▶ snapshot(): EngineStats, EngineTokenStats (services/types.py)

vLLM calls the logger from its output handler, on this process's event loop, so plain ints do;
it runs once per engine step, hence no more than a few additions.
"""

from __future__ import annotations

import bisect
import dataclasses
import time
from typing import Any, final

from ..types import TIME_TO_FIRST_TOKEN_BUCKETS, EngineStats, EngineTokenStats
from .progress import Progress

# The window of EngineTokenStats.generation_tokens_per_second.
TOKEN_RATE_INTERVAL_SECONDS = 5.0


@final
@dataclasses.dataclass(slots=True)
class Counters:
    """EngineStats as they accumulate; mutated by the stat logger only (and aborts)."""

    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    requests: int = 0
    requests_with_cached_prefix: int = 0
    aborted: int = 0
    running: int = 0
    waiting: int = 0
    kv_cache_usage: float = 0.0

    def snapshot(self) -> EngineStats:
        return EngineStats(**dataclasses.asdict(self))


@final
@dataclasses.dataclass(slots=True)
class TokenCounters:
    """EngineTokenStats as they accumulate; mutated by the stat logger only."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    first_token_counts: list[int] = dataclasses.field(
        default_factory=lambda: [0] * (len(TIME_TO_FIRST_TOKEN_BUCKETS) + 1)
    )
    first_token_sum: float = 0.0
    # the token rate's window: where it starts, and the rate over the window before it
    window_start: float = dataclasses.field(default_factory=time.monotonic)
    window_tokens: int = 0
    last_rate: float = 0.0

    def add(self, prompt_tokens: int, generation_tokens: int, first_tokens: list[float]) -> None:
        self.prompt_tokens += prompt_tokens
        self.generation_tokens += generation_tokens
        for seconds in first_tokens:
            self.first_token_counts[bisect.bisect_left(TIME_TO_FIRST_TOKEN_BUCKETS, seconds)] += 1
            self.first_token_sum += seconds
        now = time.monotonic()
        if now - self.window_start >= TOKEN_RATE_INTERVAL_SECONDS:
            self.last_rate = self._rate(now)
            self.window_start, self.window_tokens = now, self.generation_tokens

    def _rate(self, now: float) -> float:
        elapsed = now - self.window_start
        return (self.generation_tokens - self.window_tokens) / elapsed if elapsed > 0 else 0.0

    def snapshot(self) -> EngineTokenStats:
        now = time.monotonic()
        # no step has closed the window for a while (an idle engine): the rate over it so far
        stale = now - self.window_start >= TOKEN_RATE_INTERVAL_SECONDS
        return EngineTokenStats(
            prompt_tokens=self.prompt_tokens,
            generation_tokens=self.generation_tokens,
            generation_tokens_per_second=self._rate(now) if stale else self.last_rate,
            time_to_first_token_counts=tuple(self.first_token_counts),
            time_to_first_token_sum=self.first_token_sum,
        )


def stats_recorder_factory(counters: Counters, tokens: TokenCounters, progress: Progress) -> Any:
    """A vLLM stat logger class that adds each step's stats into ``counters`` and ``tokens``,
    and tells ``progress`` the engine stepped."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class _StatsRecorder(StatLoggerBase):
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            self.counters = counters
            self.tokens = tokens

        def record(
            self,
            scheduler_stats: Any,
            iteration_stats: Any,
            mm_cache_stats: Any = None,
            engine_idx: int = 0,
        ) -> None:
            c = self.counters
            if scheduler_stats is not None:
                # one per engine step, with or without output tokens: the watchdog's progress
                progress.stepped()
                c.running = scheduler_stats.num_running_reqs
                c.waiting = scheduler_stats.num_waiting_reqs
                c.kv_cache_usage = scheduler_stats.kv_cache_usage
                prefix = scheduler_stats.prefix_cache_stats
                c.prefix_cache_queries += prefix.queries
                c.prefix_cache_hits += prefix.hits
            if iteration_stats is not None:
                for finished in iteration_stats.finished_requests:
                    c.requests += 1
                    if finished.num_cached_tokens > 0:
                        c.requests_with_cached_prefix += 1
                self.tokens.add(
                    iteration_stats.num_prompt_tokens,
                    iteration_stats.num_generation_tokens,
                    iteration_stats.time_to_first_tokens_iter,
                )

        def log_engine_initialized(self) -> None:
            pass

    return _StatsRecorder
