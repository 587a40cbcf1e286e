"""`python -m gpu.crosscheck`: the cross-check's command line (see `gpu.crosscheck.cli`)."""

from .cli import main

raise SystemExit(main())
