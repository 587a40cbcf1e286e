"""Studies built on the packages, not part of them: paper reproductions, training runs, the probes that calibrated
the hardware models, device scripts and one-off tools.  They import emufloat, flashsim and gpu; nothing in the
packages imports them, and they are not installed: run them from a checkout (`python -m studies.golden`)."""
