"""``python -m flashsim``: the flashsim command line (see [`flashsim.cli`][flashsim.cli])."""

from .cli import main

raise SystemExit(main())
