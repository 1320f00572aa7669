"""validation.ensemble: a real deep ensemble against the closed-form NTK-GP variance.

Profiles: default (1,024 members of width 512; long) and ``quick``
(``--config=configs/ensemble.py:quick``: 32 members of width 64; under a minute on 2 CPU cores).
"""

import ml_collections


def get_config(arg=None) -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.width = 512  # hidden width of the members' (width, width) MLP
  c.members = 1024  # ensemble size M (a sample variance: at least 2)
  c.num_steps = 400  # full-batch GD steps per member (the variance converges long before)
  c.chunk = 128  # members trained together per vmapped call (bounds memory)
  # The extras: the centred prior form, the same ensemble on y ≡ 0, and CSD (the plot's bands).
  c.extras = True
  c.centred_members = 256
  c.zero_target_members = 512
  c.csd_tower_width = 256  # the free towers of CSD with exact-NTK labels
  c.csd_last_layer_steps = 10_000  # CSD, last-layer labels (matched form)
  c.csd_ntk_steps = 2_000  # CSD, exact-NTK labels
  if arg == "quick":
    c.width = 64
    c.members = 32
    c.num_steps = 100
    c.centred_members = 16
    c.zero_target_members = 16
    c.csd_last_layer_steps = 200
    c.csd_ntk_steps = 20
  elif arg is not None:
    raise ValueError(f"configs/ensemble.py has profiles '' and 'quick', not {arg!r}")
  return c
