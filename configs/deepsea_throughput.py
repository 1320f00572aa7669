"""benchmarks.deepsea_throughput: agent env steps/s on DeepSea per agent and size, the nets'
first layer gathering the one-hot inputs' rows or multiplying them, side by side in one process.

Profiles: default, ``quick`` (one small cell, one timed chunk: a test of the code path), and
``seeds``: S seeds as one vmapped program (each S of ``seed_groups``) against one process per
seed, ``processes`` at a time (``benchmarks.deepsea_throughput.run_seeds``); ``seeds,quick`` tests
that path.
"""

import ml_collections


def get_config(arg=None) -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.agents = "dqn,csd,csd_sa,rnd_sa,bdqn"  # configs/deepsea.py profiles
  c.sizes = "10,30,50"
  c.first_layers = "dense,gather"  # how the nets' first layer meets the one-hot input
  c.chunk_steps = 250  # vectorised steps per jitted chunk (as rl.deepsea)
  c.warmup_chunks = 3  # compile and start learning (512 env steps)
  c.timed_chunks = 4
  profile = (arg or "").split(",")
  if "seeds" in profile:
    c.agents, c.sizes = "csd_sa,dqn", "10"  # one size
    c.seed_groups = "4,8"  # S: seeds in one vmapped program
    c.baseline_runs = 4  # one-seed runs in separate processes,
    c.processes = 2  # this many at a time (the 2-core grid's workers)
    c.seed_mesh = ""  # "seeds=D": the seed axis over D devices
    c.warmup_chunks, c.timed_chunks = 3, 3
  if "quick" in profile:
    c.agents, c.sizes = "csd_sa", "5"
    c.chunk_steps, c.warmup_chunks, c.timed_chunks = 100, 2, 1
    if "seeds" in profile:
      c.seed_groups, c.baseline_runs = "2", 2
  if not set(profile) <= {"", "quick", "seeds"}:
    raise ValueError(
        f"configs/deepsea_throughput.py has profiles '', 'quick', 'seeds' and "
        f"'seeds,quick', not {arg!r}"
    )
  return c
