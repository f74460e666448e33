"""gRPC's poller for ``mmgate serve``: the classic one, unless the operator chose.

    mmgate serve ─▶ GRPC_EXPERIMENTS unset? ─▶ set CLASSIC_POLLER (this process only)
                                └ set (an empty value too) ─▶ left as it is

With grpcio's default, the EventEngine, every message a stream writes completes on grpc's
completion-queue poller thread, which then wakes the event loop: two thread wake-ups a streamed
token. The classic poller lets the thread that waits on the completion queue poll the sockets
itself. On a machine whose cores the engine keeps busy, that made mmgate's server 1.04x faster
at c=16 (docs/benchmarks.md, "gRPC's classic poller in the server"). grpc reads
GRPC_EXPERIMENTS once, when it initialises, so this runs before grpc is imported; clients
(``mmgate generate``, ``mmgate bench``, services.client) are left to their own processes' choice.
"""

from __future__ import annotations

from collections.abc import MutableMapping

VARIABLE = "GRPC_EXPERIMENTS"
CLASSIC_POLLER = "-event_engine_client,-event_engine_listener,-event_engine_for_all_other_endpoints"


def serve_environment(environ: MutableMapping[str, str]) -> str:
    """Choose the classic poller in ``environ`` unless GRPC_EXPERIMENTS is set; what it holds."""
    return environ.setdefault(VARIABLE, CLASSIC_POLLER)


def describe(value: str) -> str:
    """For the log: which poller ``value`` of GRPC_EXPERIMENTS means."""
    if value == CLASSIC_POLLER:
        return "classic (GRPC_EXPERIMENTS set by mmgate serve)"
    return f"as GRPC_EXPERIMENTS={value!r} chooses" if value else "grpc's default (EventEngine)"


__all__ = ["CLASSIC_POLLER", "VARIABLE", "describe", "serve_environment"]
