"""``rl.vizdoom``: one DQN-family agent on VizDoom MyWayHome (envpool).

    python -m rl.vizdoom --config=configs/vizdoom.py:csd_sa --out_dir=out/doom_csd_sa
    python -m rl.vizdoom --config=configs/vizdoom.py:csd_sa,paper --out_dir=...   # for a GPU
    python -m rl.vizdoom --config=configs/vizdoom.py:rnd,nature --config.variant=very_sparse ...

The profile is ``agent[,setting]``. The agent (``dqn``, ``csd``, ``rnd``, ``bdqn``, or the CSD
paper's ``csd_sa`` and its RND twin ``rnd_sa``) picks the sub-configs (``configs/deepsea.py``
says which). The setting picks what the agent sees and the size of its nets (a profile without
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

import jax
import ml_collections

from rl import dqn

AGENTS = ("dqn", "csd", "rnd", "bdqn", "csd_sa", "rnd_sa")
SETTINGS = ("cpu", "paper", "nature")
VARIANTS = ("dense", "sparse", "very_sparse")

# (channels, kernel, stride) of the Q-net convs, padding, dense widths.
_Q_NETS = {
    "paper": (((32, 3, 2), (32, 3, 2), (64, 3, 2)), "SAME", (256,)),
    "cpu": (((16, 3, 2), (32, 3, 2), (32, 3, 2)), "SAME", (256,)),
    "nature": (((32, 8, 4), (64, 4, 2), (64, 3, 1)), "VALID", (512,)),
}


def default_setting() -> str:
  """``paper`` where JAX has an accelerator, else ``cpu``."""
  return "cpu" if jax.default_backend() == "cpu" else "paper"


def get_config(profile: str | None = None) -> ml_collections.ConfigDict:
  """The config of ``profile`` = ``agent[,setting]`` (default ``dqn``) on VizDoom MyWayHome.

  A profile without a setting (or with ``auto``) yields ``setting = "auto"`` with the ``cpu``
  setting's fields: ``rl.vizdoom.resolve_setting`` rebuilds it as ``default_setting()`` once
  the program has started, and ``rl.vizdoom.check`` refuses it until then. No JAX backend is
  queried here (flags are parsed before ``jax.distributed.initialize``)."""
  agent, _, setting = (profile or "dqn").partition(",")
  # No setting: "auto", which rl.vizdoom replaces with default_setting() once JAX has started (a
  # multi-process run may query the backend only after jax.distributed.initialize); until then
  # the fields are cpu's.
  auto = not setting or setting == "auto"
  setting = "cpu" if auto else setting
  if agent not in AGENTS:
    raise ValueError(
        f"unknown agent {agent!r} in profile {profile!r} of configs/vizdoom.py; "
        f"valid: {', '.join(AGENTS)}"
    )
  if setting not in SETTINGS:
    raise ValueError(
        f"unknown setting {setting!r} in profile {profile!r} of configs/vizdoom.py; "
        f"valid: {', '.join(SETTINGS)}"
    )
  paper, nature = setting == "paper", setting == "nature"
  config = ml_collections.ConfigDict()
  config.agent = agent
  config.setting = "auto" if auto else setting  # a label: the fields below hold what it chose
  config.seed = 0  # seeds the agent and the envs
  config.variant = "dense"  # where the agent starts: dense, sparse or very_sparse
  config.total_steps = {"paper": 10_000_000, "cpu": 1_000_000, "nature": 100_000}[setting]
  config.max_episodes = 0  # stop after this many episodes (0: no limit)
  config.stop_after_solved_episodes = -1  # stop this many episodes after the first success
  config.checkpoint_every = 50_000  # env steps; 0: only at the end
  config.log_every = 10_000  # env steps between progress lines
  config.plot = True  # OUT_DIR/learning_curve.png
  config.env_timeout_s = 300.0  # an env start / step slower than this is a failure

  config.pixels = ml_collections.ConfigDict(
      dict(
          size=84 if nature else 42,  # frames resized to size x size
          stack=4 if nature else 6,  # frames stacked per observation
          gray=not nature,  # ViZDoom's 8-bit gray, else RGB
          frame_skip=1 if paper else 4,  # game frames per agent step (must divide 2,100)
          actions=18 if nature else 5,
      )
  )  # 5: one of my_way_home.cfg's buttons per step (the CSD
  # authors' wrapper); 18: envpool's button combinations

  convs, padding, widths = _Q_NETS[setting]
  c51 = paper and agent in ("csd_sa", "rnd_sa")  # the paper's CSD and RND agents use C51
  config.dqn = ml_collections.ConfigDict(
      dict(
          num_envs=8 if nature else 16,
          gamma=0.997,
          n_step=10,
          learning_rate=6.25e-4 if c51 else 2.5e-4,
          num_atoms=101 if c51 else 1,  # > 1: C51, Q_ext a distribution on this many atoms
          v_min=-1.0,
          v_max=1.0,  # on [v_min, v_max] (the armor's reward is 1)
          adam_eps=1.5e-4,
          max_grad_norm=10.0,
          batch_size=256 if paper else 32,
          updates_per_step=2 if nature else 1,  # gradient updates per vectorised env step
          target_update_frames=8000,  # env steps between target-network syncs
          learning_starts=100_000 if paper else 10_000,  # env steps before the first update
          buffer_size=1_000_000 if paper else 100_000,  # replay capacity in transitions
          prioritized=paper,  # prioritised replay on Q_ext's per-sample loss, with
          priority_exponent=0.5,  # transitions drawn ∝ (loss + 1e-6)^this, and importance
          importance_exponent=dqn.IMPORTANCE_EXPONENT,  # weights' exponent, annealed from this
          # to 1 over the run
          eps_start=1.0,
          eps_end=0.01,  # ε-greedy, decayed linearly over
          exploration_fraction=0.05 if paper else 0.1,  # this fraction of total_steps
          convs=convs,
          padding=padding,  # the Q-net torso: (channels, kernel, stride) per conv,
          widths=widths,  # then dense layers of these widths;
          residual=paper,  # or IMPALA stages (3x3 conv, max-pool, 2 residual
          # blocks) of the convs' channels,
          spectral_norm=paper,
      )
  )  # their dense layers spectrally normalised (IMPALA only)

  if agent in ("csd", "rnd"):
    config.bonus = ml_collections.ConfigDict(
        dict(
            coef=0.1,  # weight of the bonus divided by its running std
            at_update=False,  # computed once at collection and stored (no pixel gather per update)
            center=False,  # subtract its running mean
            recent=0,
        )
    )  # half of the bonus's batch from the newest this-many transitions
  if agent in ("csd_sa", "rnd_sa"):
    # paper: the paper's β schedule (0.1 -> 0.01 for CSD, 1 -> 0.01 for RND, over 3.3M frames).
    # cpu and nature: β 3e-4 -> 3e-5 and an intrinsic γ of 0.99, tuned for csd_sa on Dense
    # seed 100 (docs/results.md): r_in is divided by its running std, which puts Q̂_in's
    # spread over actions ~300x Q_ext's, so the paper's β flips most greedy actions.
    # The reward-prior weight is the paper's; centring and the recent half as tuned on DeepSea.
    beta = (0.1 if agent == "csd_sa" else 1.0) if paper else 3e-4
    config.bonus = ml_collections.ConfigDict(
        dict(
            coef=beta,
            coef_end=0.01 if paper else 3e-5,  # β, decayed linearly over
            decay_steps=3_300_000 // config.pixels.frame_skip,  # this many env steps
            reward_prior=0.5,  # Q̂_in = Q_in + reward_prior · r_in (normalised)
            intrinsic_gamma=0.0 if paper else 0.99,  # the intrinsic head's γ (0: dqn.gamma)
            at_update=True,  # r_in of the replayed pairs with the current bonus
            center=True,  # r_in − running mean
            recent=400,  # half of the bonus's batch from the newest this-many pairs
            pool=1 if paper else 3,  # the bonus sees the frames average-pooled by this factor
            # (> 1: flattened, and its nets are MLPs)
            # CSD only: each context is its pair's frame stack flipped / cropped with this
            # probability (the paper's 0.25; the cpu setting's runs were measured without)
            context_augment=0.25 if paper and agent == "csd_sa" else 0.0,
        )
    )
  if agent == "csd":
    config.csd = ml_collections.ConfigDict(
        dict(prior_width=0, lr=0.05)  # hidden width of the prior's dense layer (0: the Q torso's)
    )  # SGD step size of g (Nesterov 0.99, global-norm clip 1)
  if agent == "csd_sa":
    config.csd = ml_collections.ConfigDict(
        dict(
            convs=((16, 3, 2), (16, 3, 2), (32, 3, 2)) if paper else (),  # of the prior and towers
            prior_width=256,  # hidden width of the prior f on (s, a)
            tower_widths=(256,),  # deep CSD's towers φ, ψ (unit-normalised outputs)
            embed_dim=256 if paper else 64,
            lr=2.5e-4,
        )
    )  # Adam step size of the towers
  if agent == "rnd":
    config.rnd = ml_collections.ConfigDict(
        dict(lr=1e-4, dim=64)  # predictor's Adam step size
    )  # output size of the RND nets (the Q torso)
  if agent == "rnd_sa":
    config.rnd = ml_collections.ConfigDict(
        dict(
            convs=((16, 3, 2), (16, 3, 2), (32, 3, 2)) if paper else (),  # of both RND nets
            widths=(256,),
            lr=1e-4,
            dim=64,
        )
    )
  if agent == "bdqn":
    config.bdqn = ml_collections.ConfigDict(dict(num_heads=10, prior_scale=1.0, mask_prob=0.5))
    config.dqn.eps_start = config.dqn.eps_end = 0.0  # it explores by its sampled head
  return config
