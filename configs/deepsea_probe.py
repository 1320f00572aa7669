"""``benchmarks.deepsea_probe``: one state-action agent on the tuning DeepSea, its values read
cell by cell every ``probe_every`` episodes.

    python -m benchmarks.deepsea_probe --config.run.size=40 --config.episodes=4000 \\
        --config.run.bonus.reward_prior=0.5 --out_dir=...

The profile picks the agent (``csd_sa``, the default, or ``rnd_sa``); ``run`` is that agent's
``configs/deepsea.py`` config on the tuning MDP (mapping seed 0, which the sweep does not
evaluate), so every field of it can be overridden as ``--config.run.<field>``.
"""

import ml_collections

from configs import deepsea


def get_config(agent: str | None = None) -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.run = deepsea.get_config(agent or "csd_sa")
  c.run.update(dict(size=40, mapping_seed=0, seed=0))
  c.episodes = 4000
  c.probe_every = 250
  return c
