"""What ``mmgate bench`` reports: a summary (text, JSON) and a plot of latency over the run.

Percentiles are nearest-rank over the requests that succeeded; throughput counts successful
requests and their output tokens over the run's wall time. The client's own CPU time is
measured (``time.process_time``): a client that used most of a core was the bottleneck, and
the run says so instead of presenting its figures as the server's.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, final

from .load import Outcome

PERCENTILES = (50, 90, 99)
# the client's CPU over the wall time beyond which it, not the server, limited the run
CLIENT_BOUND_SHARE = 0.8


def percentile(values: list[float], p: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[rank - 1]


@final
@dataclass(frozen=True, slots=True)
class Summary:
    requests: int
    succeeded: int
    dropped: int  # open loop: arrivals not sent, max_in_flight reached
    wall_seconds: float
    requests_per_second: float
    output_tokens_per_second: float
    ttft_ms: dict[str, float | None]
    latency_ms: dict[str, float | None]
    codes: dict[str, int]
    kinds: dict[str, int]
    lookups: dict[str, int]  # "stage/outcome/tier" -> count
    client_cpu_share: float  # the client's CPU seconds / wall seconds (1.0: one core)
    client_bound: bool

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def status(outcome: Outcome) -> str:
    """A request's status as reported: the code, and mmgate's reason where it gave one."""
    return f"{outcome.code} ({outcome.reason})" if outcome.reason else outcome.code


def summarize(outcomes: list[Outcome], dropped: int, wall: float, client_cpu: float) -> Summary:
    ok = [o for o in outcomes if o.code == "OK"]
    ttfts = [o.ttft for o in ok if o.ttft is not None]
    latencies = [o.latency for o in ok]
    lookups = Counter("/".join(lookup) for o in ok for lookup in o.lookups)
    share = client_cpu / wall if wall > 0 else 0.0
    return Summary(
        requests=len(outcomes),
        succeeded=len(ok),
        dropped=dropped,
        wall_seconds=wall,
        requests_per_second=len(ok) / wall if wall > 0 else 0.0,
        output_tokens_per_second=sum(o.tokens for o in ok) / wall if wall > 0 else 0.0,
        ttft_ms={f"p{p}": _ms(percentile(ttfts, p)) for p in PERCENTILES},
        latency_ms={f"p{p}": _ms(percentile(latencies, p)) for p in PERCENTILES},
        codes=dict(sorted(Counter(status(o) for o in outcomes).items())),
        kinds=dict(sorted(Counter(o.kind for o in outcomes).items())),
        lookups=dict(sorted(lookups.items())),
        client_cpu_share=share,
        client_bound=share >= CLIENT_BOUND_SHARE,
    )


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 2)


def render(summary: Summary, target: str) -> str:
    def row(name: str, value: str) -> str:
        return f"  {name:<24} {value}\n"

    def quantiles(values: dict[str, float | None]) -> str:
        return "  ".join(f"{k} {'-' if v is None else f'{v:,.1f}'} ms" for k, v in values.items())

    s = summary
    text = f"mmgate bench {target}\n"
    text += row("requests", f"{s.requests:,} ({s.succeeded:,} OK, {s.dropped:,} not sent)")
    text += row("kinds", ", ".join(f"{k} {v:,}" for k, v in s.kinds.items()) or "-")
    text += row("wall time", f"{s.wall_seconds:,.2f} s")
    text += row("throughput", f"{s.requests_per_second:,.2f} req/s")
    text += row("output tokens", f"{s.output_tokens_per_second:,.1f} tok/s")
    text += row("time to first token", quantiles(s.ttft_ms))
    text += row("end to end", quantiles(s.latency_ms))
    text += row("status codes", ", ".join(f"{k} {v:,}" for k, v in s.codes.items()) or "-")
    text += "  cache lookups (stage/outcome/tier)\n"
    for name, count in s.lookups.items() or [("-", 0)]:
        text += f"    {name:<32} {count:,}\n"
    text += row("client CPU", f"{s.client_cpu_share:.0%} of one core")
    if s.client_bound:
        text += (
            "  warning: the client used most of a core; it, not the server, limited this run "
            "(run fewer workers per process, or several processes)\n"
        )
    return text


def plot(outcomes: list[Outcome], summary: Summary, path: Path, target: str) -> None:
    """Latency over the run (each request at its start) and its distribution, as a PNG."""
    try:
        import matplotlib
    except ImportError as exc:  # the bench extra: pip install 'mmgate[bench]'
        raise SystemExit("mmgate bench --plot needs matplotlib (the 'bench' extra)") from exc
    matplotlib.use("Agg")
    from matplotlib import pyplot

    ok = [o for o in outcomes if o.code == "OK"]
    failed = [o for o in outcomes if o.code != "OK"]
    figure, (over_time, spread) = pyplot.subplots(1, 2, figsize=(12, 4.5))
    over_time.scatter(
        [o.started for o in ok], [o.latency * 1000 for o in ok], s=6, label="end to end"
    )
    over_time.scatter(
        [o.started for o in ok if o.ttft is not None],
        [o.ttft * 1000 for o in ok if o.ttft is not None],
        s=6,
        label="first token",
    )
    if failed:
        over_time.scatter(
            [o.started for o in failed], [o.latency * 1000 for o in failed], s=12, marker="x",
            color="red", label="failed",
        )  # fmt: skip
    over_time.set_xlabel("request start (s into the run)")
    over_time.set_ylabel("latency (ms)")
    over_time.set_title("latency over the run")
    over_time.legend(loc="best")
    latencies = [o.latency * 1000 for o in ok]
    if latencies:
        spread.hist(latencies, bins=min(50, max(5, len(latencies) // 5)))
    for (name, value), style in zip(summary.latency_ms.items(), ("--", "-.", ":"), strict=True):
        if value is not None:
            spread.axvline(
                value, linestyle=style, color="black", linewidth=1, label=f"{name} {value:,.0f} ms"
            )
    spread.legend(loc="upper left")
    spread.set_xlabel("end-to-end latency (ms)")
    spread.set_ylabel("requests")
    spread.set_title("latency distribution")
    figure.suptitle(
        f"mmgate bench {target}: {summary.succeeded:,} requests, "
        f"{summary.output_tokens_per_second:,.0f} tok/s"
    )
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    pyplot.close(figure)


__all__ = ["Summary", "percentile", "plot", "render", "status", "summarize"]
