"""Golden et al., "Is Flash Attention Stable?" (arXiv 2405.02803), reproduced with flashsim: the grid
(:mod:`.grid`), the policies of its precisions and variants (:mod:`.policies`), FlashAttention-1's algorithm
(:mod:`.fa1`) and the report (:mod:`.report`); ``python -m studies.golden --help`` (docs/golden.md)."""
