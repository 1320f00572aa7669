"""benchmarks.deepsea_throughput: agent env steps/s on DeepSea per agent and size, the nets'
first layer gathering the one-hot inputs' rows or multiplying them, side by side in one process.

Profiles: default, and ``quick`` (one small cell, one timed chunk: a test of the code path).
"""

import ml_collections


def get_config(arg=None) -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.agents = "dqn,csd,csd_sa,rnd_sa,bdqn"   # configs/deepsea.py profiles
  c.sizes = "10,30,50"
  c.first_layers = "dense,gather"          # how the nets' first layer meets the one-hot input
  c.chunk_steps = 250                       # vectorised steps per jitted chunk (as rl.deepsea)
  c.warmup_chunks = 3                       # compile and start learning (512 env steps)
  c.timed_chunks = 4
  if arg == "quick":
    c.agents, c.sizes = "csd_sa", "5"
    c.chunk_steps, c.warmup_chunks, c.timed_chunks = 100, 2, 1
  elif arg is not None:
    raise ValueError(f"configs/deepsea_throughput.py has profiles '' and 'quick', not {arg!r}")
  return c
