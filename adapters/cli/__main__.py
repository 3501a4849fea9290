"""``python -m baton.adapters.cli``: the same as the ``baton`` console script."""

import sys

from baton.adapters.cli import main

sys.exit(main())
