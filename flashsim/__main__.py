"""``python -m flashsim``: the flashsim command line (see [`flashsim.cli`][flashsim.cli])."""

import gc

from .cli import main

status = main()
gc.freeze()  # the process ends here: no final collection of everything the run imported (a noticeable pause)
raise SystemExit(status)
