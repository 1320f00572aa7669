"""``benchmarks.ood``: which methods run on which tasks and seeds, and every method's settings.

    python -m benchmarks.ood --out_dir=out/ood                          # this file's defaults
    python -m benchmarks.ood --config=configs/ood.py:quick --out_dir=/tmp/ood   # tiny, for tests
    python -m benchmarks.ood --config=configs/ood.py:comparisons --out_dir=out/ood  # + comparison rows
    python -m benchmarks.ood --config.seeds=5 --config.method.csd.num_steps=2000 --out_dir=...

``config.method.<name>`` holds each method's full config (its defaults: ``uncertainty_kit.defaults``,
plain data); only the methods named in ``config.methods`` run.
"""

import ml_collections
from ml_collections import config_dict

from cmdline import cli
from uncertainty_kit import defaults

# The quick profile: every network trains this many steps, on small data.
QUICK_STEPS = 30
QUICK_MAX_TRAIN = 600
QUICK_MAX_TEST = 150


PROFILES = ("quick", "comparisons")


def get_config(profile: str | None = None) -> ml_collections.ConfigDict:
  """The headline run (every method's own row), or ``profile``, a comma-separated subset of
  ``PROFILES``: "quick" (small data, ``QUICK_STEPS`` steps per network), "comparisons" (adds
  ``defaults.comparison_methods()``: CSD-Aug without the overlapping transforms, and the other
  tower form)."""
  parts = [p for p in (profile or "").split(",") if p]
  if any(p not in PROFILES for p in parts):
    raise ValueError(
        f"unknown profile {profile!r} of configs/ood.py; valid: a comma-separated subset of "
        f"{', '.join(PROFILES)}"
    )
  config = ml_collections.ConfigDict()
  config.dataset = "embedded"  # embedded (offline) or tfds (four MNIST-like sets)
  extra = defaults.comparison_methods() if "comparisons" in parts else ()
  config.methods = ",".join(defaults.MAIN_METHODS + extra)
  config.seeds = 1  # seeds 0 .. seeds-1; docs/results.md uses 2 and 5
  config.num_test = 1000  # embedded: held-out examples per ID set and seed
  # eval: the table; tune: the tuning parts and the ID tuning slice (never evaluated), scored by
  # the same fits, for hyper-parameter search.
  config.split = "eval"
  config.max_train = config_dict.placeholder(int)  # cap on training examples per task
  # Cap on scored ID test examples and on each OOD set's context and evaluation parts (the
  # tuning parts get half of it).
  config.max_test = config_dict.placeholder(int)
  # The alternate-tower CSD variants (defaults.alternate_towers()) run on the first this many
  # seeds only: the tower comparison costs one seed.
  config.tower_comparison_seeds = 1
  config.plots = True
  # Steps between checkpoints inside a fit (classifier, members, CSD's g, RND): a killed run
  # resumes mid-fit. 0: only finished fits are checkpointed.
  config.checkpoint_every = 0
  # dataset=tfds only:
  config.data_dir = config_dict.placeholder(str)  # the tfds data folder
  config.notmnist_path = config_dict.placeholder(str)  # NotMNIST archive or folder
  config.family = ",".join(defaults.FAMILY)  # the sets used
  config.download = False  # let tfds download missing sets
  config.method = cli.editable(defaults.methods())
  if "quick" in parts:
    config.max_train = QUICK_MAX_TRAIN
    config.max_test = QUICK_MAX_TEST
    for name in config.method:
      config.method[name].update(defaults.small_budget(name, QUICK_STEPS))
  return config
