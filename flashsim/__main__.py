"""``python -m flashsim``: the flashsim command line (see :mod:`flashsim.cli`)."""

from .cli import main

raise SystemExit(main())
