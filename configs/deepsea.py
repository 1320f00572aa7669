"""``rl.deepsea``: one DQN-family agent on DeepSea (bsuite's deep-exploration chain).

    python -m rl.deepsea --out_dir=out/deepsea                      # dqn, this file's defaults
    python -m rl.deepsea --config=configs/deepsea.py:csd --config.size=20 \\
        --config.total_steps=70000 --out_dir=out/ds20_csd

The profile picks the agent (``dqn``, ``csd``, ``rnd``, ``bdqn``, or the CSD paper's agent
``csd_sa`` and its RND twin ``rnd_sa``: a bonus of state-action pairs and an intrinsic value head
with the reward prior, ``rl.dqn``); each profile holds only the sub-configs its agent reads
(``rl.agents``): ``dqn`` (the learner, every agent), ``bonus`` with ``csd`` or ``rnd`` (the
intrinsic reward), ``bdqn`` (heads and priors). Every field and its default is
``rl.run_config.DeepSea``'s; this file states what DeepSea changes. Settings close to bsuite's DQN / BootDQN
baselines (Adam 1e-3, γ 0.99, batch 128, K = 10 heads, prior scale 3, mask probability 0.5),
adapted to 4 envs stepping together with one update per vectorised step (csd_sa and bdqn: one
env, an update per env step);
docs/results.md records the runs that chose the settings below.

``--config.num_seeds=S`` trains seeds ``seed`` .. ``seed + S - 1`` together, as one program
vmapped over a seed axis (``rl.deepsea.train_seeds``); each seed's records go to OUT_DIR/seed<s>.

Steps are env steps summed over the envs (an episode of size N takes N + 1: N moves and the
auto-reset step).
"""

import ml_collections

from rl import agents
from rl import run_config


def get_config(agent: str | None = None) -> ml_collections.ConfigDict:
  """The config of ``agent`` (default ``dqn``) on DeepSea: ``rl.run_config.DeepSea``'s defaults
  and what DeepSea changes of them."""
  agent = agent or "dqn"
  if agent not in agents.AGENTS:
    raise ValueError(
        f"unknown profile {agent!r} of configs/deepsea.py; valid: {', '.join(agents.NAMES)}"
    )
  config = run_config.config_dict(run_config.profile(run_config.DeepSea, agent))
  parts = agents.AGENTS[agent]

  # Only 4 envs: all envs of a greedy agent walk the same path until the next update, so more
  # envs cost episodes. 1-step targets and a constant ε = 0.1: a next-observation bonus reaches
  # Q only through transitions already taken, so an untried action at the edge of the visited
  # region is found by ε alone, and n-step returns follow the behaviour path.
  config.dqn.update(
      dict(
          num_envs=4,
          batch_size=128,
          target_update_frames=32,
          learning_starts=512,
          eps_start=0.1,
          eps_end=0.1,
      )
  )
  if parts.bonus != "none" and not parts.state_action:
    # centred: untried actions look better than tried ones
    config.bonus.update(dict(coef=0.3, center=True, recent=400))
  if parts.state_action:
    # Acting is greedy in Q_ext + β Q̂_in: the reward prior makes untried actions look valuable,
    # so no ε is needed; centred, a path of familiar pairs is worth less than an untried action.
    config.bonus.update(dict(coef=1.0, coef_end=1.0, reward_prior=1.0, center=True, recent=400))
    config.dqn.eps_start = config.dqn.eps_end = 0.0
  if agent == "csd":
    config.csd.lr = 1.0  # SGD step size of g (Nesterov 0.99, global-norm clip 1)
  if agent == "csd_sa":
    # the prior MLP f on (one-hot s, one-hot a); towers φ, ψ
    config.csd.update(dict(tower_widths=(64, 64), lr=1e-3))
    # Only pairs rarer than 2 running stds above the mean pay: the diagonal's familiar pairs and
    # the walk below it then pay the same (nothing), so the frontier's novelty decides.
    config.bonus.update(dict(floor=True, floor_std=2.0))
    # One env, learning at every env step: greedy envs reset together walk one path in
    # lockstep (a quarter of the episodes distinct); 4x the updates per episode of 4 envs.
    config.dqn.num_envs = 1
  if parts.bonus == "rnd":
    config.rnd.lr = 1e-3 if agent == "rnd" else 3e-3  # their hidden widths: dqn.q_widths
  if agent == "bdqn":
    config.dqn.target_update_frames = 16
    config.dqn.eps_start = config.dqn.eps_end = 0.0  # it explores by its sampled head
    # One env, learning at every env step, as csd_sa: 4x the updates per episode of 4 envs,
    # chosen for both on the tuning MDP (mapping seed 0, N = 40; docs/results.md).
    config.dqn.num_envs = 1
  return config
