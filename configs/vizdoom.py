"""``rl.vizdoom``: one DQN-family agent on VizDoom MyWayHome (envpool).

    python -m rl.vizdoom --config=configs/vizdoom.py:csd --config.total_steps=2000000 \\
        --out_dir=out/doom_csd
    python -m rl.vizdoom --config=configs/vizdoom.py:rnd --config.variant=very_sparse ...

The profile picks the agent (``dqn``, ``csd``, ``rnd`` or ``bdqn``); each profile holds only the
sub-configs its agent reads (``configs/deepsea.py`` says which). Settings close to the CSD
authors' setup: γ 0.997, 10-step returns, Adam 2.5e-4, clip 10, a target sync every 8,000
frames, ε 1 -> 0.01, two Nature-CNN updates of batch 32 per vectorised step of 8 envs.

Steps are env steps summed over the envs; envpool's frame skip of 4 is not counted.
"""

import ml_collections

AGENTS = ("dqn", "csd", "rnd", "bdqn")
VARIANTS = ("dense", "sparse", "very_sparse")


def get_config(agent: str | None = None) -> ml_collections.ConfigDict:
  """The config of ``agent`` (default ``dqn``) on VizDoom MyWayHome."""
  agent = agent or "dqn"
  if agent not in AGENTS:
    raise ValueError(f"unknown profile {agent!r} of configs/vizdoom.py; valid: {', '.join(AGENTS)}")
  config = ml_collections.ConfigDict()
  config.agent = agent
  config.seed = 0                     # seeds the agent and the envs
  config.variant = "dense"            # where the agent starts: dense, sparse or very_sparse
  config.total_steps = 100_000
  config.max_episodes = 0             # stop after this many episodes (0: no limit)
  config.stop_after_solved_episodes = -1  # stop this many episodes after the first success
  config.checkpoint_every = 50_000    # env steps; 0: only at the end
  config.log_every = 10_000           # env steps between progress lines
  config.plot = True                  # OUT_DIR/learning_curve.png
  config.env_timeout_s = 300.0        # an env start / step slower than this is a failure

  config.dqn = ml_collections.ConfigDict(dict(
      num_envs=8, gamma=0.997, n_step=10, learning_rate=2.5e-4, adam_eps=1.5e-4,
      max_grad_norm=10.0, batch_size=32,
      updates_per_step=2,             # gradient updates per vectorised env step
      target_update_frames=8000,      # env steps between target-network syncs
      learning_starts=10_000,         # env steps before the first update
      buffer_size=100_000,            # replay capacity in transitions
      eps_start=1.0, eps_end=0.01,    # ε-greedy, decayed linearly over
      exploration_fraction=0.1))      # this fraction of total_steps

  if agent in ("csd", "rnd"):
    config.bonus = ml_collections.ConfigDict(dict(
        coef=0.1,           # weight of the bonus divided by its running std
        at_update=False,    # computed once at collection and stored (no pixel gather per update)
        center=False,       # subtract its running mean
        recent=0))          # half of the bonus's batch from the newest this-many transitions
  if agent == "csd":
    config.csd = ml_collections.ConfigDict(dict(
        prior_width=0,      # hidden width of the prior's dense layer (0: the Nature torso's 512)
        lr=0.05))           # SGD step size of g (Nesterov 0.99, global-norm clip 1)
  if agent == "rnd":
    config.rnd = ml_collections.ConfigDict(dict(
        lr=1e-4,            # predictor's Adam step size
        dim=64))            # output size of the RND nets (Nature-CNN torsos)
  if agent == "bdqn":
    config.bdqn = ml_collections.ConfigDict(dict(num_heads=10, prior_scale=1.0, mask_prob=0.5))
    config.dqn.eps_start = config.dqn.eps_end = 0.0   # it explores by its sampled head
  return config
