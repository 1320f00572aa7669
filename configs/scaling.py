"""benchmarks.scaling: CSD's fit over 1, 2, 4, … devices, and its per-step cost against the
closed form's as N grows. (Which devices it runs on are flags: ``--simulated_devices``,
``--device_counts``.)

Profiles: default (4,000 digits, 300 timed CSD steps, N up to 16,000) and ``quick``
(``--config=configs/scaling.py:quick``: 512 digits, 10 steps, N ≤ 1000; a test of the code path).
"""

import ml_collections


def get_config(arg=None) -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.num_train = 4000  # training digits of the device-count runs
  c.num_queries = 512  # held-out digits whose CSD variance is compared across meshes
  c.csd_steps = 300  # timed CSD steps per device count
  c.classifier_steps = 100  # timed classifier steps per device count
  c.ns = (500, 1000, 2000, 4000, 8000, 16000)  # training-set sizes N of the cost-vs-N panel
  c.max_closed_form_seconds = 120.0  # skip sizes predicted (N³) to take longer than this
  if arg == "quick":
    c.num_train = 512
    c.num_queries = 64
    c.csd_steps = 10
    c.classifier_steps = 5
    c.ns = (500, 1000)
  elif arg is not None:
    raise ValueError(f"configs/scaling.py has profiles '' and 'quick', not {arg!r}")
  return c
