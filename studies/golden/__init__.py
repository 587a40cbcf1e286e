"""Golden et al., "Is Flash Attention Stable?" (arXiv 2405.02803), reproduced with flashsim: the grid
(`.grid`), the policies of its precisions and variants (`.policies`), FlashAttention-1's algorithm
(`.fa1`) and the report (`.report`); `python -m studies.golden --help` (docs/golden.md)."""
