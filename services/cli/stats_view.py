"""``mmgate stats`` as text: the three cache levels, the cache actor's health, the engine.

A pure function of a ``GetStatsResponse``, so the table is tested without a server.

GetStats counts the actor's lookups over all its stages together (prompt, response, image,
embedding); per-stage and per-tier media hits are in the Prometheus metrics
(``mmgate_cache_media_lookups_total``). The media row therefore shows the media pipeline's own
work, and the actor's row its totals, rather than a media hit ratio GetStats cannot give.

A caller who is not an admin gets its own tenant's figures only (docs/security.md): then the
table shows those, and says the rest is an admin's.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..proto.mmgate.v1 import cache_pb2

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def render_stats(stats: cache_pb2.GetStatsResponse) -> str:
    """The cache levels, actor health and engine state as aligned text, ending in a newline."""
    a, e, m = stats.actor, stats.engine, stats.media
    served = a.hits + a.misses + a.coalesced
    detail = f"hit {a.hits:,}, coalesced {a.coalesced:,}, miss {a.misses:,}"
    if a.tier_hits:
        detail += f" ({a.tier_hits:,} from the second tier)"
    header = [
        ("model", stats.model or "-"),
        ("media mode", stats.media_mode or "-"),
        ("tenant", stats.tenant or "-"),
    ]
    levels = [
        ("level", "looked up", "hit", "ratio", ""),
        (
            "page",
            f"{e.prefix_cache_queries:,} tokens",
            f"{e.prefix_cache_hits:,} tokens",
            _ratio(e.prefix_cache_hits, e.prefix_cache_queries),
            "KV blocks resident in the engine",
        ),
        (
            "prefix",
            f"{e.requests:,} requests",
            f"{e.requests_with_cached_prefix:,} requests",
            _ratio(e.requests_with_cached_prefix, e.requests),
            "requests that reused a cached prefix",
        ),
        (
            "actor",
            f"{served:,} lookups",
            f"{a.hits + a.coalesced:,} lookups",
            _ratio(a.hits + a.coalesced, served),
            f"all stages: {detail}",
        ),
    ]
    media = [
        ("images decoded, encoded", f"{m.decodes:,}, {m.encodes:,}"),
        ("encoder runs (batches)", f"{m.encode_batches:,}"),
        ("refused, not held", f"{m.rejected:,}, {m.not_held:,}"),
        ("hit ratio per stage", "not in GetStats: mmgate_cache_media_lookups_total"),
    ]
    v = stats.video
    if v.decodes or v.rejected or v.not_held:
        media[2:2] = [
            ("clips decoded (frames)", f"{v.decodes:,} ({v.frames:,})"),
            ("clips refused, not held", f"{v.rejected:,}, {v.not_held:,}"),
        ]
    health = [
        ("alive", "yes" if a.alive else "NO"),
        ("loop lag", f"{a.loop_lag_seconds * 1000:.1f} ms"),
        ("flights, waiters", f"{a.flights:,}, {a.waiters:,}"),
        ("oldest flight", f"{a.oldest_flight_seconds:.1f} s"),
        ("mailbox depth", f"{a.mailbox_depth:,}"),
        ("entries, bytes", f"{a.entries:,}, {_bytes(a.bytes)}"),
        ("evictions", f"{a.evictions:,} ({_bytes(a.evicted_bytes)})"),
        ("recursion rejections", f"{a.recursion_rejections:,}"),
        ("compute timeouts", f"{a.compute_timeouts:,}"),
        ("overloaded", f"{a.overloaded:,}"),
        (
            "second tier",
            f"breaker {'OPEN' if a.tier_breaker_open else 'closed'}, "
            f"{a.tier_errors:,} read errors, {a.tier_write_errors:,} write errors",
        ),
    ]
    h = stats.engine_health
    silence = f", no step for {h.seconds_since_step:.1f} s" if h.seconds_since_step >= 1 else ""
    engine = [
        ("state", f"{h.state or '-'}{silence}"),
        ("in flight, stalls", f"{h.in_flight:,}, {h.stalls:,}"),
        ("running, waiting", f"{e.running:,}, {e.waiting:,}"),
        ("KV cache usage", f"{e.kv_cache_usage:.1%}"),
        ("aborted", f"{e.aborted:,}"),
    ]
    tenants = [("tenant", "lookups", "hit ratio", "entries", "bytes", "of budget", "requests")]
    for t in stats.tenants:
        looked_up = t.hits + t.misses + t.coalesced
        tenants.append(
            (
                t.tenant,
                f"{looked_up:,}",
                _ratio(t.hits + t.coalesced, looked_up),
                f"{t.entries:,}",
                _bytes(t.bytes),
                _ratio(t.bytes, t.budget_bytes),
                f"{t.active_requests:,} of {t.max_concurrent_requests:,}",
            )
        )
    sections = [_pairs(header)]
    if stats.HasField("actor"):
        sections += [
            "cache levels\n" + _columns(levels),
            "media\n" + _pairs(media),
            "actor health\n" + _pairs(health),
        ]
    else:
        sections.append("cache levels\n  all tenants' figures: an admin's (docs/security.md)\n")
    if stats.tenants:
        sections.append("tenants\n" + _columns(tenants))
    sections.append("engine\n" + _pairs(engine))
    return "\n".join(sections)


def _ratio(part: int, whole: int) -> str:
    # "-" rather than 0%: nothing was looked up yet, which is not a cache that never hits
    return f"{part / whole:.1%}" if whole else "-"


def _bytes(count: int) -> str:
    value = float(count)
    for unit in _UNITS:
        if value < 1024 or unit == _UNITS[-1]:
            return f"{count} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def _pairs(rows: Sequence[tuple[str, str]]) -> str:
    width = max(len(name) for name, _ in rows)
    return "".join(f"  {name:<{width}}  {value}\n" for name, value in rows)


def _columns(rows: Sequence[tuple[str, ...]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for row in rows:
        # names and notes (first and last column) read left to right; numbers line up on the right
        cells = [
            cell.ljust(width) if i in (0, len(row) - 1) else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  " + "  ".join(cells).rstrip() + "\n")
    return "".join(lines)
