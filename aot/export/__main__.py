"""``python -m aot.export``: :func:`aot.export.cli.main`."""

import sys

from aot.export.cli import main

sys.exit(main())
