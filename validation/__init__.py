"""Numerical checks of the theory, each an absl binary writing DIR/<name>.json and a plot.

    python -m validation.ntk_check    --out_dir=DIR   # kernels vs independent references
    python -m validation.single_query --out_dir=DIR   # the single-query theorem
    python -m validation.ensemble     --out_dir=DIR   # a real deep ensemble vs the NTK-GP
    python -m validation.contextual   --out_dir=DIR   # contextual CSD vs its closed forms

Each takes ``--config=configs/<name>.py`` (the default; ``:quick`` selects the small profile,
under a minute each on 2 CPU cores) and ``--config.<field>=value`` overrides.

Shared pieces: ``runner`` (command line, float64, output), ``agreement`` (error and rank
measures), ``problems`` (toy data), ``factorised_ntk`` (the MLP empirical NTK without a
Jacobian), ``plots``.
"""
