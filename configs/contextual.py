"""validation.contextual: contextual CSD against the closed-form NTK-GP variance of its label
kernel, on a 1-D toy, a 2-D toy and an MNIST subset.

Profiles: default (every variant, full budgets; hours on a CPU) and ``quick``
(``--config=configs/contextual.py:quick``: every code path once, narrow priors, short fits;
about a minute on 2 CPU cores).
"""

import ml_collections

# Every variant of validation.contextual (csd_long needs a "long" step budget: toy_2d only).
VARIANTS = (
    "csd,csd_aug,csd_ood,free_towers,free_towers_ood,ntk_labels,ntk_labels_ood,"
    "deep,deep_ood,deep_block,free_diagonal"
)


def _steps(matched: int, free: int, ntk: int) -> ml_collections.ConfigDict:
  """Steps per variant family: matched (csd*), free towers, exact-NTK labels, deep."""
  return ml_collections.ConfigDict({"matched": matched, "free": free, "ntk": ntk, "deep": free})


def get_config(arg=None) -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.problems = "toy_1d,toy_2d,mnist"
  # Each problem: the prior's (width, width) MLP, the free towers' width, the variants run and
  # their step budgets.
  c.toy_1d = ml_collections.ConfigDict(
      {
          "width": 512,
          "tower_width": 256,
          "variants": VARIANTS,
          "steps": _steps(matched=5_000, free=4_000, ntk=1_500),
      }
  )
  c.toy_2d = ml_collections.ConfigDict(
      {
          "width": 512,
          "tower_width": 256,
          "variants": VARIANTS + ",csd_long",
          "steps": _steps(matched=10_000, free=4_000, ntk=1_500),
          "long_learning_rate": 2.0,
      }
  )  # csd_long: 4× the matched form's default SGD rate
  c.toy_2d.steps.long = 20_000
  # MNIST: the prior's last-layer kernel has rank ≤ width + 1, so the width must exceed the
  # number of training digits by a margin or Θ_L's posterior is ~0 on every query.
  c.mnist = ml_collections.ConfigDict(
      {
          "width": 1024,
          "tower_width": 256,
          "variants": "csd,csd_aug,csd_ood,free_towers,deep,deep_ood,ntk_labels",
          "steps": _steps(matched=2_000, free=2_000, ntk=300),
          "num_train": 250,
          "num_test": 150,
          "num_ood": 60,
      }
  )  # num_ood: per shifted query set
  if arg == "quick":  # every code path once: matched, Aug, OOD, free towers, NTK labels, deep
    for name, width, variants in (
        ("toy_1d", 128, "csd,ntk_labels"),
        ("toy_2d", 128, "csd_aug,free_towers_ood,deep"),
        ("mnist", 256, "csd_ood"),
    ):
      c[name].width = width
      c[name].variants = variants
      c[name].steps.update({"matched": 400, "free": 200, "ntk": 40, "deep": 200})
    c.toy_2d.steps.long = 400
    c.mnist.update({"num_train": 40, "num_test": 20, "num_ood": 8})
  elif arg is not None:
    raise ValueError(f"configs/contextual.py has profiles '' and 'quick', not {arg!r}")
  return c
