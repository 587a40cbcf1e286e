"""gpu: Triton attention kernels, calibration probes and emulator cross-checks (planned; issues 3, 5, 6).

Importing this package needs torch and triton (the ``gpu`` extra).
"""
