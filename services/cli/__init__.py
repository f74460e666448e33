"""The ``mmgate`` command (commands.py), its table views (stats_view.py), and the settings tables
of docs/service.md (settings_table.py, ``make settings-table``)."""

from .commands import main

__all__ = ["main"]
