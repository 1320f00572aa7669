"""validation.ntk_check: the kernels of csd_jax.ntk against independent references.

Profiles: default (every spec, depth and width; minutes) and ``quick``
(``--config=configs/ntk_check.py:quick``: one spec, two widths; under a minute on 2 CPU cores).
"""

import math

import ml_collections


def get_config(arg=None) -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.seed = 0
  # Nets whose empirical NTK is checked against an explicit Jacobian product (comma-separated
  # names of validation.ntk_check.EMPIRICAL_SPECS).
  c.empirical_specs = "mlp_relu_ntk,mlp_relu_ntk_3out,mlp_erf_standard,mlp_relu_nobias,cnn"
  # Infinite-width ReLU kernels vs the closed form over depths × σ_w × σ_b (None: no bias).
  c.infinite_depths = (1, 2, 3)
  c.infinite_w_stds = (math.sqrt(2.0), 1.5)
  c.infinite_b_stds = (None, 0.1, 1.0)
  # ‖Θ̂ − Θ‖/‖Θ‖ at init by width, root-mean-square over sweep_seeds inits.
  c.sweep_widths = (64, 128, 256, 512, 1024, 2048, 4096)
  c.sweep_seeds = 4
  if arg == "quick":
    c.empirical_specs = "mlp_relu_ntk_3out"  # each spec costs several compilations
    c.infinite_depths = (1, 2)
    c.infinite_w_stds = (math.sqrt(2.0),)
    c.infinite_b_stds = (None, 0.1)
    c.sweep_widths = (64, 256)
    c.sweep_seeds = 2
  elif arg is not None:
    raise ValueError(f"configs/ntk_check.py has profiles '' and 'quick', not {arg!r}")
  return c
