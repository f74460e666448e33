"""The HTTP/2 connection policy of the server (docs/service.md, "Connections"), as grpc's
channel arguments (grpc's doc/keepalive.md; max connection age: its proposal A9).

    client pings ─▶ closer than min_ping_interval while mmgate sends nothing? a strike
                    ─▶ more than max_ping_strikes: GOAWAY too_many_pings
    quiet connection ─▶ mmgate pings every keepalive_seconds ─▶ no answer in
                        keepalive_timeout_seconds: closed (a peer that has gone)
    connection older than max_age_seconds ─▶ GOAWAY ─▶ calls in flight get the grace period;
                                              the client reconnects (perhaps to a new replica)
"""

from __future__ import annotations

from ..config import ConnectionSettings


def _ms(seconds: float) -> int:
    return round(seconds * 1000)


def connection_options(settings: ConnectionSettings) -> list[tuple[str, int]]:
    options = [
        # a generation that sends nothing for a while (a unary call) must survive a client that
        # pings every second (Go and Java clients, proxies): grpc's defaults (5 min, 2 strikes)
        # close such a connection within seconds, and a client retrying UNAVAILABLE reruns it
        (
            "grpc.http2.min_ping_interval_without_data_ms",
            _ms(settings.min_ping_interval_seconds),
        ),
        ("grpc.http2.max_ping_strikes", settings.max_ping_strikes),
        ("grpc.keepalive_permit_without_calls", int(settings.permit_pings_without_calls)),
        ("grpc.keepalive_time_ms", _ms(settings.keepalive_seconds)),
        ("grpc.keepalive_timeout_ms", _ms(settings.keepalive_timeout_seconds)),
    ]
    if settings.max_age_seconds is not None:
        options += [
            ("grpc.max_connection_age_ms", _ms(settings.max_age_seconds)),
            ("grpc.max_connection_age_grace_ms", _ms(settings.max_age_grace_seconds)),
        ]
    return options


__all__ = ["connection_options"]
