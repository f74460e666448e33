"""``python -m services.cli``: the ``mmgate`` command."""

import sys

from . import main

sys.exit(main())
