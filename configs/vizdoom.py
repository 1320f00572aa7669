"""``rl.vizdoom``: one DQN-family agent on VizDoom MyWayHome (envpool).

    python -m rl.vizdoom --config=configs/vizdoom.py:csd_sa --out_dir=out/doom_csd_sa
    python -m rl.vizdoom --config=configs/vizdoom.py:csd_sa,paper --out_dir=...   # for a GPU
    python -m rl.vizdoom --config=configs/vizdoom.py:rnd,nature --config.variant=very_sparse ...

The profile is ``agent[,setting]``. The agent (``dqn``, ``csd``, ``rnd``, ``bdqn``, or the CSD
paper's ``csd_sa`` and its RND twin ``rnd_sa``) picks the sub-configs (``rl.agents``).
Every field and its default is ``rl.run_config.VizDoom``'s; this file states what each setting
and agent change. The setting picks what the agent sees and the size of its nets (a profile without
one is ``auto``: ``rl.vizdoom`` picks ``paper`` or ``cpu`` once JAX has started):

* ``paper``: the CSD authors' setup (thesis App. B): 42x42 gray frames, a 6-frame stack, no
  frame skip, their wrapper's 5 actions (one button per step), 16 envs, batch 256, one update
  per vectorised step, replay 1M, learning from 100k frames, ε 1 -> 0.01 over 500k frames,
  10M frames; IMPALA Q-nets (residual stages of 32, 32, 64 channels) + 256; the state-action
  CSD nets convolutional (16, 16, 32) + 256, 256-d. Sized for an accelerator (the default
  there).
* ``cpu``: the same frames and actions with a frame skip of 4 (the 2,100-frame episodes are
  525 steps), a small conv torso (16, 32, 32) + 256, one update of batch 32 per vectorised
  step of 16 envs (two replayed samples per env step), and the state-action bonus on the
  frames average-pooled to 14x14 (an MLP): a run of 1M env steps (4M frames) fits in about an
  hour of two CPU cores (the default without an accelerator).
* ``nature``: MyWayHome-v1's 84x84 RGB, 4-frame stack, frame skip 4, its 18 combined actions
  (turn none/left/right x forward off/on x strafe none/left/right), the Nature-DQN torso, two
  updates of batch 32 per vectorised step of 8 envs.

Common to all: γ 0.997, 10-step double-DQN returns, Adam 2.5e-4, clip 10, a target sync every
8,000 env steps; in ``paper``, the state-action agents' Q_ext is C51 (101 atoms, Adam
6.25e-4), CSD's contexts are augmented (p = 0.25: random perspective, horizontal flip,
resized crop), and replay is prioritised (importance exponent 0.45 -> 1; the other settings
take ``--config.dqn.prioritized=True``), and the IMPALA Q-nets' dense layers are spectrally
normalised. Steps are env steps summed over the envs; the frame skip is not counted in them.
"""

import ml_collections

from rl import agents
from rl import run_config

# The Q-nets of the settings other than cpu (whose nets are rl.run_config.VizDoomDQN's
# defaults): (channels, kernel, stride) of the convs, padding, dense widths. paper's convs give
# the channels of the IMPALA stages.
_Q_NETS = {
    "paper": (((32, 3, 2), (32, 3, 2), (64, 3, 2)), "SAME", (256,)),
    "nature": (((32, 8, 4), (64, 4, 2), (64, 3, 1)), "VALID", (512,)),
}
# The paper's convolutional nets of the state-action bonuses (CSD's prior and towers, RND's).
_BONUS_CONVS = ((16, 3, 2), (16, 3, 2), (32, 3, 2))
# The paper's decay of the state-action agents' β, in game frames.
_BETA_DECAY_FRAMES = 3_300_000


def default_setting() -> str:
  """``paper`` where JAX has an accelerator, else ``cpu``."""
  import jax  # pylint: disable=g-import-not-at-top  (the config file itself loads no JAX)

  return "cpu" if jax.default_backend() == "cpu" else "paper"


def parse_profile(profile: str | None) -> tuple[str, str, bool]:
  """(agent, setting, auto) of ``profile`` = ``agent[,setting]``; a profile without a setting
  (or with ``auto``) is ``auto`` with the ``cpu`` setting's fields. ValueError for an unknown
  agent or setting."""
  agent, _, setting = (profile or "dqn").partition(",")
  auto = not setting or setting == agents.AUTO
  setting = "cpu" if auto else setting
  if agent not in agents.AGENTS:
    raise ValueError(
        f"unknown agent {agent!r} in profile {profile!r} of configs/vizdoom.py; "
        f"valid: {', '.join(agents.NAMES)}"
    )
  if setting not in agents.SETTINGS:
    raise ValueError(
        f"unknown setting {setting!r} in profile {profile!r} of configs/vizdoom.py; "
        f"valid: {', '.join(agents.SETTINGS)}"
    )
  return agent, setting, auto


def set_view(config: ml_collections.ConfigDict, setting: str) -> None:
  """What the agent sees and does: cpu's frames (the defaults) with paper's lack of frame skip,
  or nature's 84x84 RGB and envpool's 18 combined actions."""
  if setting == "paper":
    config.total_steps = 10_000_000
    config.pixels.frame_skip = 1
  if setting == "nature":
    config.total_steps = 100_000
    config.pixels.update(dict(size=84, stack=4, gray=False, actions=18))


def set_learner(config: ml_collections.ConfigDict, setting: str, agent: str) -> None:
  """The Q-learner: 10-step double-DQN returns with γ 0.997 in every setting; paper's is the
  CSD authors' (large replay and batch, prioritised replay, IMPALA Q-nets, C51 for the
  state-action agents)."""
  paper, nature = setting == "paper", setting == "nature"
  config.dqn.update(dict(gamma=0.997, n_step=10, learning_rate=2.5e-4, learning_starts=10_000))
  if setting in _Q_NETS:
    convs, padding, widths = _Q_NETS[setting]
    config.dqn.update(dict(convs=convs, padding=padding, widths=widths))
  if paper:
    config.dqn.update(
        dict(
            batch_size=256,
            learning_starts=100_000,
            buffer_size=1_000_000,
            exploration_fraction=0.05,
            prioritized=True,
            residual=True,
            spectral_norm=True,
        )
    )
    if agents.AGENTS[agent].state_action:  # the paper's CSD and RND agents use C51
      config.dqn.update(dict(num_atoms=101, learning_rate=6.25e-4))
  if nature:
    config.dqn.update(dict(num_envs=8, updates_per_step=2))


def set_bonus(config: ml_collections.ConfigDict, setting: str, agent: str) -> None:
  """The intrinsic reward and its nets."""
  paper, parts = setting == "paper", agents.AGENTS[agent]
  if parts.bonus != "none" and not parts.state_action:
    # computed once at collection and stored: no pixel gather per update
    config.bonus.update(dict(coef=0.1, at_update=False))
  if parts.state_action:
    # paper: the paper's β schedule. cpu and nature: a β well below the paper's, since r_in is
    # divided by its running std, which makes Q̂_in's spread over actions far larger than
    # Q_ext's (docs/results.md). The bonus of cpu and nature sees frames pooled 3x (MLPs),
    # csd_sa's on cpu 6x (below).
    config.bonus.update(
        dict(
            coef=(0.1 if agent == "csd_sa" else 1.0) if paper else 3e-4,
            coef_end=0.01 if paper else 3e-5,
            decay_steps=_BETA_DECAY_FRAMES // config.pixels.frame_skip,
            intrinsic_gamma=0.0 if paper else 0.99,
            center=True,
            recent=400,
            pool=1 if paper else 3,
        )
    )
  if agent == "csd_sa" and paper:  # each context flipped / cropped with this probability
    config.bonus.context_augment = 0.25
  if agent == "csd_sa" and setting == "cpu":
    # the bonus on 7x7 frames and Q_in's convs on 14x14 frames: 0.71x DQN's env steps/s
    # (0.50x without), and it explored on both tuning seeds (docs/results.md)
    config.bonus.update(dict(pool=6, intrinsic_pool=3))
  if agent == "csd":
    config.csd.update(dict(prior_width=0, lr=0.05))  # prior width 0: the Q torso's
  if agent == "csd_sa":
    config.csd.update(dict(lr=2.5e-4, embed_dim=256 if paper else 64))
    if paper:
      config.csd.convs = _BONUS_CONVS
  if agent == "rnd_sa" and paper:
    config.rnd.convs = _BONUS_CONVS


def get_config(profile: str | None = None) -> ml_collections.ConfigDict:
  """The config of ``profile`` = ``agent[,setting]`` (default ``dqn``) on VizDoom MyWayHome:
  ``rl.run_config.VizDoom``'s defaults (the ``cpu`` setting's view and nets) and what the
  setting and the agent change of them.

  A profile without a setting (or with ``auto``) yields ``setting = "auto"`` with the ``cpu``
  setting's fields: ``rl.vizdoom.resolve_setting`` rebuilds it as ``default_setting()`` once
  the program has started (a multi-process run may query JAX's backend only after
  ``jax.distributed.initialize``), and the run check refuses it until then."""
  agent, setting, auto = parse_profile(profile)
  config = run_config.config_dict(run_config.profile(run_config.VizDoom, agent))
  config.setting = agents.AUTO if auto else setting
  set_view(config, setting)
  set_learner(config, setting, agent)
  set_bonus(config, setting, agent)
  if agent == "bdqn":
    config.bdqn.prior_scale = 1.0
    config.dqn.eps_start = config.dqn.eps_end = 0.0  # it explores by its sampled head
  return config
