"""The ``mmgate`` command (commands.py) and its table views (stats_view.py)."""

from .commands import main

__all__ = ["main"]
