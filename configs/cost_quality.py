"""benchmarks.cost_quality: mean AUROC against fit seconds, CSD's budgets against ENS(M).

Profiles: default (the embedded benchmark, seed 0, every budget) and ``quick``
(``--config=configs/cost_quality.py:quick``: 300 digits, a few steps; a test of the code path).
"""

import ml_collections
from ml_collections import config_dict


def get_config(arg=None) -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.seeds = 1  # seeds 0 .. seeds-1 of the embedded tasks
  c.num_test = 1000
  c.max_train = config_dict.placeholder(int)  # training images per task (None: all)
  c.train_steps = config_dict.placeholder(int)  # per classifier / member (None: defaults.TRAIN's)
  c.csd_variants = "csd,csd_aug,csd_ood"
  c.csd_steps = (150, 300, 600, 1200)  # g's optimiser steps
  c.ensemble_sizes = (1, 3, 5, 10, 15)
  c.mc_dropout = True
  c.plots = True
  if arg == "quick":
    c.max_train = 300
    c.num_test = 100
    c.train_steps = 4
    c.csd_variants = "csd"
    c.csd_steps = (2,)
    c.ensemble_sizes = (1, 2)
    c.mc_dropout = False
  elif arg is not None:
    raise ValueError(f"configs/cost_quality.py has profiles '' and 'quick', not {arg!r}")
  return c
