"""``python -m gpu.crosscheck``: the cross-check's command line (see :mod:`gpu.crosscheck.cli`)."""

from .cli import main

raise SystemExit(main())
