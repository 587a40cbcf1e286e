"""Device scripts: GPU work in one call each, run from a checkout (`PYTHONPATH=.`, no install needed).

- `run_attention.py` (`run_attention.sh`): smoke test, tile search, accuracy, recorded cases for the
  emulator, the replay of recorded cases, a training check.
- `verify_models.py` (`run_verify.sh`): emufloat's hardware models against the GPU at scale.
- `train_check.py`: a small transformer trained with our attention and with SDPA.
- `record_nan_backward.py`: the backward runs whose rows are NaN (gpu/data/runs).
- `run_probes.sh`: the calibration probes (`python -m studies.probes.run`); `run_checks.sh`: the GPU tests
  and `python -m gpu.crosscheck --live`; `run_module.sh`: what the other .sh files call.
- their shared argument checks are `gpu.commands`.

Each Python script takes `--help`; a bad argument ends it with one line naming it and exit status 2,
before any GPU work.
"""
