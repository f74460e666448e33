"""``python -m services.cli``: the ``mmgate`` command."""

import sys

from .commands import main

sys.exit(main())
