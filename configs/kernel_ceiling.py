"""benchmarks.kernel_ceiling: the best AUROC a closed-form kernel variance reaches on the OOD
benchmark, for the linear kernel of each layer of the benchmark's classifier.

Profiles: default (all 4,000 training digits, the benchmark's budget) and ``quick``
(``--config=configs/kernel_ceiling.py:quick``: 600 digits, 150 test images, 30 steps).
"""

import ml_collections
from ml_collections import config_dict

LAYERS = "pixels,conv1,conv2,dense,logits"


def get_config(arg=None) -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.seeds = 2  # the OOD benchmark's tasks and classifiers 0 … seeds-1
  c.ridges = (1e-7, 1e-6, 1e-5, 1e-4, 1e-3)  # relative to tr Σ_X
  c.layers = LAYERS  # comma-separated kernels, from LAYERS
  c.max_train = config_dict.placeholder(int)  # training digits (None: all)
  c.max_test = config_dict.placeholder(int)  # test and OOD images per set (None: all)
  c.classifier_steps = config_dict.placeholder(int)  # None: the benchmark's budget
  if arg == "quick":
    c.max_train = 600
    c.max_test = 150
    c.classifier_steps = 30  # the OOD benchmark's quick budget
  elif arg is not None:
    raise ValueError(f"configs/kernel_ceiling.py has profiles '' and 'quick', not {arg!r}")
  return c
