"""validation.single_query: the single-query theorem, measured on wide nets and a linear model.

Profiles: default (widths to 4096, two inits each; many minutes) and ``quick``
(``--config=configs/single_query.py:quick``; under a minute on 2 CPU cores).
"""

import ml_collections


def get_config(arg=None) -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.seed = 0
  # Full-batch GD steps of the ReLU nets: κ(Θ̂(X, X)) ≈ 13, so (1 − 1/κ)^200 ≈ 1e-7 (train
  # residuals ~1e-9): converged.
  c.num_steps = 200
  c.erf_num_steps = 1500  # erf: κ ≈ 60
  c.linear_num_steps = 2000  # the random-features model (exact theorem: optimiser tolerance)
  c.linear_num_features = 256
  c.widths = (256, 512, 1024, 2048, 4096)  # ReLU MLPs (n, n)
  c.erf_widths = (256, 512, 1024, 2048)  # erf MLPs (n, n)
  c.num_seeds = 2  # inits per width
  c.label_scales = (0.001, 0.01, 0.1, 1.0, 10.0)
  c.label_scale_width = 1024
  if arg == "quick":
    c.widths = (128, 512)
    c.erf_widths = (128,)
    c.num_seeds = 1
    c.label_scales = (0.1, 1.0)
    c.label_scale_width = 256
  elif arg is not None:
    raise ValueError(f"configs/single_query.py has profiles '' and 'quick', not {arg!r}")
  return c
