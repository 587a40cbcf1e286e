"""The repository's tools, run from its root as `python -m tools.NAME` (not part of the installed packages)."""
