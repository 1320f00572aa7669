"""benchmarks.device_check: one prepared check of a lent GPU in under 8 minutes (BUILD.md, "GPU
check"): deep CSD's fit and inference against ENS(15), the test files that touch devices, and
the VizDoom ``paper`` setting's agent env steps/s, each stage under its own time budget.

Profiles: default (the benchmark's sizes, for one GPU) and ``dry`` (tiny sizes, one VizDoom
cell of the ``cpu`` setting and one small test: the code path on a CPU, tests/test_device_check.py).
"""

import ml_collections
from ml_collections import config_dict


def get_config(arg=None) -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.seed = 0  # the embedded task, the fits' keys, the VizDoom runs
  c.stages = "csd,tests,doom"  # run in this order; doom last: a hung env start ends the process
  # Deep CSD (the benchmark's ``csd`` method) against ENS(15) (``ens15``), on the embedded task.
  c.csd = ml_collections.ConfigDict()
  c.csd.budget_s = 150.0  # data, compiles and every timed call of the stage
  c.csd.max_train = config_dict.placeholder(int)  # training digits (None: all 4,000)
  c.csd.num_steps = config_dict.placeholder(int)  # g's steps (None: the method's 1,200)
  c.csd.batch_size = config_dict.placeholder(int)  # Bx and Bc (None: the method's 128)
  c.csd.fit_repeats = 3  # timed whole fits after a compiling one (median); fewer once
  # past 45 % of the budget
  c.csd.ens_members = config_dict.placeholder(int)  # None: 15
  c.csd.ens_steps = config_dict.placeholder(int)  # per member (None: the method's 300)
  c.csd.ens_batch_size = config_dict.placeholder(int)  # None: the method's 128
  c.csd.ens_repeats = 1  # timed ensemble trainings after a compiling one (fewer once
  # past 75 % of the budget)
  c.csd.query_batch = 512  # inference batch (ID test images, as benchmarks.throughput)
  c.csd.repeats = 5  # timed calls per round (median)
  c.csd.rounds = 3  # round-robin rounds over CSD and ENS (median of the rounds)
  # tests/ files that build meshes or count devices, run with -m 'not slow' -n0.
  c.tests = ml_collections.ConfigDict()
  c.tests.budget_s = 150.0  # the pytest process is killed past it
  c.tests.files = "tests/test_parallel.py,tests/test_distributed.py"
  c.tests.select = ""  # pytest -k expression ("": every test of the files)
  # benchmarks.doom_throughput's cells, each one run of its run_cells.
  c.doom = ml_collections.ConfigDict()
  c.doom.budget_s = 150.0  # a cell starts only if the time left is at least the last cell's
  c.doom.cells = "paper:dqn,paper:csd_sa"
  c.doom.steps = 3000  # timed env steps per cell, all of them learning
  c.doom.buffer_size = 20_000
  c.doom.variant = "dense"
  c.doom.env_timeout_s = 120.0
  if arg == "dry":
    c.csd.budget_s, c.tests.budget_s, c.doom.budget_s = 60.0, 60.0, 60.0
    c.csd.max_train, c.csd.num_steps, c.csd.batch_size = 128, 3, 16
    c.csd.fit_repeats = 1
    c.csd.ens_members, c.csd.ens_steps, c.csd.ens_batch_size = 2, 2, 16
    c.csd.query_batch, c.csd.repeats, c.csd.rounds = 16, 1, 1
    c.tests.files, c.tests.select = "tests/test_parallel.py", "parse_mesh"
    # One cell, the paper's agent in the cpu setting: a paper cell's nets take minutes to run on
    # a CPU, and each cell starts 16 games and compiles its learner (10-20 s on 2 cores).
    c.doom.cells = "cpu:csd_sa"
    c.doom.steps = 32
    c.doom.buffer_size = 600
  elif arg is not None:
    raise ValueError(f"configs/device_check.py has profiles '' and 'dry', not {arg!r}")
  return c
