"""``benchmarks.exploration``: the grid of agents x DeepSea sizes x seeds (or agents x seeds on
VizDoom), every cell one run of ``rl.deepsea`` (``rl.vizdoom``).

    python -m benchmarks.exploration --config.sizes=10,20,30 --out_dir=out/exploration
    python -m benchmarks.exploration --config=configs/exploration.py:vizdoom \\
        --config.variant=very_sparse --config.seeds=3 --config.total_steps=2000000 --out_dir=...

The profile picks the env (``deepsea``, the default, or ``vizdoom[,setting]``: without a setting
``auto``, which ``benchmarks.exploration`` decides at start-up as ``rl.vizdoom`` does). The grid
sets each cell's seed, size (VizDoom: variant) and the run-length fields below; ``runs.<agent>``
holds the rest of that agent's config (``configs/deepsea.py`` / ``configs/vizdoom.py``), e.g.
``--config.runs.csd.bonus.coef=0.5``.
"""

import ml_collections

from configs import deepsea
from configs import vizdoom
from rl import agents

ENVS = ("deepsea", "vizdoom")

# Fields the grid copies as they are into every cell's config (those the profile has).
COPIED_FIELDS = (
    "variant",
    "max_episodes",
    "stop_after_solved_episodes",
    "stop_when_learned",
    "checkpoint_every",
    "log_every",
    "plot",
    "env_timeout_s",
)
# Every field of a cell's config that the grid sets: the copied ones, and those it sets per cell
# (seed, size) or derives (DeepSea's total_steps covers max_episodes episodes).
GRID_FIELDS = ("seed", "num_seeds", "size", "total_steps") + COPIED_FIELDS


def get_config(profile: str | None = None) -> ml_collections.ConfigDict:
  """The grid on ``profile`` = ``env`` ("deepsea", the default, or "vizdoom[,setting]"; the
  VizDoom runs' setting as ``configs/vizdoom.py``'s, "auto" without one)."""
  env, comma, setting = (profile or "deepsea").partition(",")
  if env not in ENVS or (comma and env != "vizdoom"):
    raise ValueError(
        f"unknown profile {profile!r} of configs/exploration.py; valid: "
        f"{', '.join(ENVS)} (vizdoom[,setting])"
    )
  module = deepsea if env == "deepsea" else vizdoom
  config = ml_collections.ConfigDict()
  config.env = env
  config.agents = ",".join(agents.NAMES)
  config.seeds = 5  # seeds first_seed .. first_seed + seeds - 1 per cell
  config.first_seed = 0
  if env == "deepsea":
    config.sizes = "10,20"
  else:
    config.variant = "dense"
    config.env_timeout_s = 300.0
  # The grid measures whether and when the goal is first reached: a run stops 100 episodes after
  # its first success, or after max_episodes. On DeepSea total_steps is raised to cover
  # max_episodes episodes of N + 1 steps.
  config.max_episodes = 3000
  config.stop_after_solved_episodes = 100
  config.stop_when_learned = False  # True: stop at bsuite's learning time (DeepSea's grade)
  config.total_steps = 100_000
  config.checkpoint_every = 0  # env steps; 0: each cell checkpoints at its end
  config.log_every = 20_000
  config.plot = True  # each cell's learning curve
  config.workers = 1  # DeepSea: cells run in this many processes
  if env == "deepsea":  # a cell's seeds as one vmapped program (rl.deepsea.
    config.vmap_seeds = True  # train_seeds); False: one run per seed
  config.report_only = False  # aggregate the finished cells, run none
  config.runs = ml_collections.ConfigDict()
  for agent in agents.NAMES:
    run = module.get_config(f"{agent},{setting}" if comma else agent)
    for field in GRID_FIELDS:
      if field in run:
        del run[field]
    config.runs[agent] = run
  return config
