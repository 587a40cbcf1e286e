"""The benchmarks: scripts run from the repository root as `python -m benchmarks.NAME` (benchmarks/README.md)."""
