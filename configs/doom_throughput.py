"""benchmarks.doom_throughput: agent env steps/s on VizDoom MyWayHome, every setting and agent
side by side in one process (``configs/vizdoom.py``'s ``agent,setting`` profiles).

Profiles: default, and ``quick`` (two cells, a few hundred steps: a test of the code path).
"""

import ml_collections


def get_config(arg=None) -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  # "setting:agent" cells, timed in this order (each in its own run of rl.vizdoom).
  c.cells = "nature:dqn,nature:csd,cpu:dqn,cpu:csd_sa,cpu:rnd_sa,cpu:csd,paper:dqn," "paper:csd_sa"
  c.variant = "dense"
  c.seed = 0
  c.steps = 3000  # timed env steps per cell, all of them learning
  c.paper_steps = 600  # the same for the paper setting (batch 256: slow without a GPU)
  c.buffer_size = 20_000  # replay of every cell (the profiles' 1M would not fit in memory)
  c.env_timeout_s = 300.0
  if arg == "quick":
    c.cells = "cpu:dqn,cpu:csd_sa"
    c.steps = 160
    c.buffer_size = 2000
  elif arg is not None:
    raise ValueError(f"configs/doom_throughput.py has profiles '' and 'quick', not {arg!r}")
  return c
