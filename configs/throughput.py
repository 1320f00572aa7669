"""benchmarks.throughput: the cost of CSD's uncertainty against ensembles, MC dropout and the
exact closed form (inference, training, and the closed form's growth with N).

Profiles: default (the whole digits set, the benchmark's training budget) and ``quick``
(``--config=configs/throughput.py:quick``: 600 digits, 20 steps; a test of the code path).
"""

import ml_collections
from ml_collections import config_dict


def get_config(arg=None) -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.seed = 0  # the task, the fits' keys (the scaling run: seed + 1)
  c.max_train = config_dict.placeholder(int)  # training digits (None: all 4,000)
  c.batch_size = 512  # query batch for inference (ID test images)
  c.repeats = 5  # timed repeats per round (median)
  c.rounds = 3  # round-robin rounds over the methods
  c.ensemble_sizes = (1, 3, 5, 10, 15)  # ENS(M); 3 and 15 are always added
  c.mc_passes = 16  # MC dropout passes k
  c.train_steps = config_dict.placeholder(int)  # per network (None: defaults.TRAIN's budget)
  c.csd_steps = config_dict.placeholder(int)  # CSD's g (None: each CSD method's own budget)
  # The closed form's cost against N, and CSD's time to a Spearman target with it.
  c.scaling = ml_collections.ConfigDict()
  c.scaling.enabled = True
  c.scaling.ns = (500, 1000, 2000, 4000, 8000, 16000)
  c.scaling.max_seconds = 60.0  # stop the closed form when one N would take longer
  c.scaling.max_bytes = 4e9  # stop the closed form when its Gram would exceed this
  c.scaling.target_spearman = 0.9
  c.scaling.csd_chunk = 250  # CSD steps between Spearman checks
  c.scaling.csd_max_steps = 1500
  if arg == "quick":
    c.max_train = 600
    c.repeats = 2
    c.rounds = 1
    c.train_steps = 20
    c.csd_steps = 20
    c.scaling.ns = (500, 1000)
    c.scaling.csd_chunk = 100
    c.scaling.csd_max_steps = 200
  elif arg is not None:
    raise ValueError(f"configs/throughput.py has profiles '' and 'quick', not {arg!r}")
  return c
