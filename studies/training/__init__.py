"""A small byte-level GPT trained with pluggable attention (Qiu & Yao's BF16 pipeline, our Triton kernel with
and without their fix, PyTorch SDPA), to look for the paper's training failure at a scale one GPU trains in
minutes (issue 33, item 4) and to sample a trained model's attention inputs (issue 32, item 3).

`studies.training.data` (numpy), `studies.training.stats` and `studies.training.model` (torch),
`studies.training.train` (the
command line), `studies.training.lean` and `studies.training.report` (CPU: the emulator on the sampled rows, plots).
"""
