"""``rl.deepsea``: one DQN-family agent on DeepSea (bsuite's deep-exploration chain).

    python -m rl.deepsea --out_dir=out/deepsea                      # dqn, this file's defaults
    python -m rl.deepsea --config=configs/deepsea.py:csd --config.size=20 \\
        --config.total_steps=70000 --out_dir=out/ds20_csd

The profile picks the agent (``dqn``, ``csd``, ``rnd``, ``bdqn``, or the CSD paper's agent
``csd_sa`` and its RND twin ``rnd_sa``: a bonus of state-action pairs and an intrinsic value head
with the reward prior, ``rl.dqn``); each profile holds only the sub-configs its agent reads:
``dqn`` (the learner, every agent), ``bonus`` with ``csd`` or ``rnd`` (the intrinsic reward),
``bdqn`` (heads and priors). Settings close to bsuite's DQN / BootDQN
baselines (Adam 1e-3, γ 0.99, batch 128, K = 10 heads, prior scale 3, mask probability 0.5),
adapted to 4 envs stepping together with one update per vectorised step; docs/results.md
records the runs that chose the settings below.

``--config.num_seeds=S`` trains seeds ``seed`` .. ``seed + S - 1`` together, as one program
vmapped over a seed axis (``rl.deepsea.train_seeds``); each seed's records go to OUT_DIR/seed<s>.

Steps are env steps summed over the envs (an episode of size N takes N + 1: N moves and the
auto-reset step).
"""

import ml_collections

from rl import dqn

AGENTS = ("dqn", "csd", "rnd", "bdqn", "csd_sa", "rnd_sa")


def get_config(agent: str | None = None) -> ml_collections.ConfigDict:
  """The config of ``agent`` (default ``dqn``) on DeepSea."""
  agent = agent or "dqn"
  if agent not in AGENTS:
    raise ValueError(f"unknown profile {agent!r} of configs/deepsea.py; valid: {', '.join(AGENTS)}")
  config = ml_collections.ConfigDict()
  config.agent = agent
  config.seed = 0  # seeds the agent and the envs
  config.num_seeds = 1  # >1: seeds seed .. seed + num_seeds - 1 as one program
  config.size = 10  # N: an N x N grid, N moves per episode
  config.mapping_seed = 42  # the action mapping (bsuite's sweep uses 42)
  config.total_steps = 100_000
  config.max_episodes = 0  # stop after this many episodes (0: no limit)
  config.stop_after_solved_episodes = -1  # stop this many episodes after the first success
  config.chunk_steps = 250  # vectorised steps per jitted collect-and-learn call
  config.checkpoint_every = 50_000  # env steps; 0: only at the end
  config.log_every = 10_000  # env steps between progress lines
  config.plot = True  # OUT_DIR/learning_curve.png

  # Only 4 envs: all envs of a greedy agent walk the same path until the next update, so more
  # envs cost episodes. 1-step targets and a constant ε = 0.1: a next-observation bonus reaches
  # Q only through transitions already taken, so an untried action at the edge of the visited
  # region is found by ε alone, and n-step returns follow the behaviour path.
  config.dqn = ml_collections.ConfigDict(
      dict(
          num_envs=4,
          gamma=0.99,
          n_step=1,
          learning_rate=1e-3,
          adam_eps=1.5e-4,
          max_grad_norm=10.0,
          batch_size=128,
          updates_per_step=1,  # gradient updates per vectorised env step
          target_update_frames=32,  # env steps between target-network syncs
          learning_starts=512,  # env steps before the first update
          buffer_size=100_000,  # replay capacity in transitions
          prioritized=False,  # prioritised replay (rl.replay), its priority exponent
          priority_exponent=0.5,  # and importance exponent (annealed from this to 1)
          importance_exponent=dqn.IMPORTANCE_EXPONENT,
          eps_start=0.1,
          eps_end=0.1,  # ε-greedy, decayed linearly over
          exploration_fraction=0.1,  # this fraction of total_steps
          q_widths=(64, 64),
      )
  )  # hidden widths of the Q-network MLP

  if agent in ("csd", "rnd"):
    config.bonus = ml_collections.ConfigDict(
        dict(
            coef=0.3,  # weight of the bonus divided by its running std
            at_update=True,  # recompute the bonus of replayed observations at each update
            center=True,  # subtract its running mean: untried actions look better than tried
            recent=400,
        )
    )  # half of the bonus's batch from the newest this-many transitions
  if agent in ("csd_sa", "rnd_sa"):
    # Acting is greedy in Q_ext + β Q̂_in: the reward prior makes untried actions look valuable,
    # so no ε is needed.
    config.bonus = ml_collections.ConfigDict(
        dict(
            coef=1.0,
            coef_end=1.0,  # β, decayed linearly to coef_end over
            decay_steps=0,  # this many env steps (0: β = coef throughout)
            reward_prior=1.0,  # Q̂_in = Q_in + reward_prior · r_in (normalised as below)
            intrinsic_gamma=0.0,  # discount of the intrinsic head (0: dqn.gamma)
            at_update=True,
            center=True,  # r_in − running mean: a path of familiar pairs is worth less
            # than an untried action
            recent=400,
        )
    )  # half of the bonus's batch from the newest this-many pairs
    config.dqn.eps_start = config.dqn.eps_end = 0.0
  if agent == "csd":
    config.csd = ml_collections.ConfigDict(
        dict(prior_width=256, lr=1.0)  # hidden width of the prior MLP f
    )  # SGD step size of g (Nesterov 0.99, global-norm clip 1)
  if agent == "csd_sa":
    config.csd = ml_collections.ConfigDict(
        dict(
            prior_width=256,  # hidden width of the prior MLP f on (one-hot s, one-hot a)
            tower_widths=(64, 64),  # deep CSD's towers φ, ψ (unit-normalised outputs)
            embed_dim=64,
            lr=1e-3,
        )
    )  # Adam step size of the towers
  if agent in ("rnd", "rnd_sa"):
    config.rnd = ml_collections.ConfigDict(
        dict(lr=1e-3 if agent == "rnd" else 3e-3, dim=64)  # predictor's Adam step size
    )  # output size of the RND nets (their hidden widths: dqn.q_widths)
  if agent == "bdqn":
    config.bdqn = ml_collections.ConfigDict(dict(num_heads=10, prior_scale=3.0, mask_prob=0.5))
    config.dqn.target_update_frames = 16
    config.dqn.eps_start = config.dqn.eps_end = 0.0  # it explores by its sampled head
  return config
