"""benchmarks.csd_diagnostics: what a deep CSD method's towers learn, per evaluation set.

Profiles: default (``csd`` on the tuning parts of seed 100, which the table never evaluates)
and ``quick`` (a few steps on a small test set; a test of the code path).
"""

import ml_collections
from ml_collections import config_dict


def get_config(arg=None) -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.method = "csd"  # a deep CSD method of uncertainty_kit.methods
  c.overrides = ml_collections.ConfigDict()  # fields of its config (as benchmarks.sweep's)
  c.seed = 100
  c.split = "tune"  # the sets measured: "tune" or "eval" parts
  c.num_test = 1000
  c.max_train = config_dict.placeholder(int)  # training images per task (None: all)
  c.bins = 40  # log-spaced histogram bins of 1 − cos over [1e-3, 2]
  c.checkpoint_dir = config_dict.placeholder(str)  # fitted cells to restore (None: out_dir's)
  c.plots = True
  if arg == "quick":
    c.num_test = 100
    c.max_train = 300
    c.overrides = ml_collections.ConfigDict(
        {
            "num_steps": 3,
            "batch_size": 16,
            "context_batch_size": 16,
            "train": {"num_steps": 2, "batch_size": 16},
        }
    )
  elif arg is not None:
    raise ValueError(f"configs/csd_diagnostics.py has profiles '' and 'quick', not {arg!r}")
  return c
