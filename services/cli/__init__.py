"""The ``mmgate`` command (commands.py) and its table views (stats_view.py).

Nothing here imports grpc: ``mmgate serve`` chooses gRPC's poller (poller.py) before grpc
initialises, which it reads once per process.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from .poller import serve_environment


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["serve"]:
        serve_environment(os.environ)
    from .commands import main as run

    return run(args)


__all__ = ["main"]
