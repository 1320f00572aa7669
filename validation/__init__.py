"""Numerical checks of the theory, each an absl binary writing DIR/<name>.json and a plot.

    python -m validation.ntk_check    --out_dir=DIR [--quick]   # kernels vs independent references
    python -m validation.single_query --out_dir=DIR [--quick]   # the single-query theorem
    python -m validation.ensemble     --out_dir=DIR [--quick]   # a real deep ensemble vs the NTK-GP
    python -m validation.contextual   --out_dir=DIR [--quick]   # contextual CSD vs its closed forms

Shared helpers (flags, float64, output, metrics, toy data) live in ``validation.common``.
"""
