"""`python -m exporter` is the same as the `gpuscope` console script."""

from __future__ import annotations

import sys

from exporter.cli import main

sys.exit(main())
