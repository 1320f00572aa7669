"""The learner's hyper-parameters: ``Config``, the static argument of ``rl.dqn``'s jitted functions.

Plain data (no JAX): the run configs (``rl.run_config``) take their defaults from ``Config``'s,
and the experiment configs (``configs/deepsea.py``, ``configs/vizdoom.py``) import them without
starting JAX. ``rl.run_config.learner`` fills a ``Config`` from a run config.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from rl import agents

if TYPE_CHECKING:  # the spec types, for the annotations only (they import JAX)
  from csd_jax import models
  from rl import networks

# The CSD bonus's context augmentations on frames (``uncertainty_kit.augment.paper_augment``):
# the paper's VizDoom list: random perspective, horizontal flip and resized crop.
CONTEXT_AUGMENTATIONS = ("hflip", "crop", "perspective")
# Prioritised replay's importance exponent β_IS at the start of a run (the CSD paper's β₀),
# annealed to 1.
IMPORTANCE_EXPONENT = 0.45


@dataclasses.dataclass(frozen=True)
class Config:
  """All hyper-parameters of one agent on one environment, in the learner's units (replay rows,
  updates); ``rl.run_config.learner`` fills them from a run config. The defaults are the
  learner's, which the run configs' fields of the same unit take as theirs."""

  agent: str
  num_actions: int
  obs_shape: tuple[int, ...]
  num_envs: int
  q_spec: models.Spec | networks.ImpalaSpec  # Q-network (torso + head; out_dim replaced)
  bonus_spec: models.Spec | None = None  # CSD prior / RND nets
  # BDQN+P
  num_heads: int = 1
  shared_torso: bool = True
  prior_scale: float = 0.0
  mask_prob: float = 1.0
  # DQN
  gamma: float = 0.99
  n_step: int = 1
  learning_rate: float = 1e-3
  adam_eps: float = 1.5e-4
  max_grad_norm: float = 10.0
  num_atoms: int = 1  # >1: C51, Q_ext a categorical distribution on num_atoms
  v_min: float = -1.0  # atoms evenly spaced on [v_min, v_max]
  v_max: float = 1.0
  batch_size: int = 32
  updates_per_step: int = 1  # gradient updates per vectorised env step that learns
  # learn on every this-many-th vectorised env step only (DQN's update period): one env with
  # period E costs what E envs with period 1 cost per env step, and walks distinct episodes
  update_period: int = 1
  target_sync_updates: int = 1000  # updates between target-network syncs
  learning_starts: int = 1000  # env steps (summed over envs) before the first update
  buffer_rows: int = 1000  # replay rows; each holds num_envs transitions
  prioritized: bool = False  # prioritised replay on Q_ext's per-sample loss
  priority_exponent: float = 0.5  # α: transitions drawn ∝ (loss + 1e-6)^α
  importance_exponent: float = IMPORTANCE_EXPONENT  # importance weights' β_IS at the start, ...
  importance_anneal_steps: int = 0  # ... linear to 1 over this many env steps (0: constant)
  eps_start: float = 1.0
  eps_end: float = 0.01
  eps_decay_steps: int = 10_000  # env steps of the linear ε decay
  # act on the target copies of the heads: the policy holds still between target syncs, so an
  # episode shorter than the sync period follows one path instead of one that each update bends
  act_on_target: bool = False
  # bonus
  bonus_coef: float = 0.0
  bonus_coef_end: float = 0.0  # with bonus_decay_steps > 0: β decays linearly to this
  bonus_decay_steps: int = 0  # env steps of the β decay (0: β = bonus_coef throughout)
  reward_prior: float = 0.5  # state_action: Q̂_in = Q_in + reward_prior · r_in
  # state_action: the bootstrap's reward prior from a copy of the bonus synced with the target
  # heads, so Q̂_in's targets do not move with every bonus update
  steady_prior: bool = False
  intrinsic_gamma: float = 0.0  # state_action: discount of the intrinsic head (0: gamma)
  # state_action: Q_in as a second head on Q_ext's torso, both losses in one Adam step (RND's
  # two value heads, Burda et al. 2019), instead of a separate net (the CSD paper's)
  intrinsic_shares_torso: bool = False
  # state_action on frames: Q_in (the Q-net's architecture) reads the frames average-pooled by
  # this, so its convs run on frames this many times smaller on each side; 1: full frames (the
  # CSD paper's)
  intrinsic_pool: int = 1
  bonus_at_update: bool = True
  bonus_center: bool = False  # subtract the running mean before dividing by the std
  # with bonus_center: normalised rewards r become max(r − bonus_floor_std, 0), so every familiar
  # input pays the same (nothing) wherever it is, and only inputs rarer than that pay
  bonus_floor: bool = False
  bonus_floor_std: float = 0.0  # with bonus_floor: the floor, in running stds above the mean
  bonus_recent_rows: int = 0  # >0: half of the bonus's batch from the newest rows
  bonus_pool: int = 1  # >1: the bonus sees image inputs average-pooled by this
  # factor and flattened (its nets are then MLPs)
  context_augment: float = 0.0  # CSD on images: each context is its input augmented
  # (CONTEXT_AUGMENTATIONS) with this probability
  csd_lr: float = 0.0  # linear CSD's SGD step size (0: csd_jax's default,
  # 0.5); deep CSD's Adam step size (0: 1e-3)
  csd_towers: models.Spec | None = None  # deep CSD's towers φ, ψ (None: linear CSD)
  csd_embed_dim: int = 64
  rnd_dim: int = 64
  rnd_lr: float = 1e-4
  obs_dtype: str = "uint8"  # replay storage dtype of observations
  # data parallelism: a jax.sharding.Mesh with a "data" axis shards each update's batch over its
  # devices (params and replay replicated; GSPMD inserts the gradient all-reduce); None: one device
  mesh: Any = None

  def __post_init__(self):
    if self.agent not in agents.AGENTS:
      raise ValueError(f"agent must be one of {agents.NAMES}, got {self.agent!r}")
    heads = agents.AGENTS[self.agent].heads
    if heads and self.num_heads < 2:
      raise ValueError(f"{self.agent} needs num_heads >= 2")
    if not heads and self.num_heads != 1:
      raise ValueError(f"{self.agent} has one head, got num_heads={self.num_heads}")
    if self.bonus_kind != "none" and self.bonus_spec is None:
      raise ValueError(f"agent {self.agent!r} needs bonus_spec")
    if self.state_action and not self.bonus_at_update:
      raise ValueError(
          f"{self.agent} needs bonus_at_update (every action's bonus is scored at " "update time)"
      )
    if self.intrinsic_shares_torso and not self.state_action:
      raise ValueError(
          f"intrinsic_shares_torso needs a state-action agent (an intrinsic head), got "
          f"{self.agent!r}"
      )
    if self.bonus_floor_std < 0:
      raise ValueError(f"bonus_floor_std must be >= 0, got {self.bonus_floor_std}")
    if self.bonus_floor and not self.bonus_center:
      raise ValueError("bonus_floor needs bonus_center (uncentred rewards are never negative)")
    if self.intrinsic_pool > 1 and (
        not self.state_action or self.intrinsic_shares_torso or len(self.obs_shape) != 3
    ):
      raise ValueError(
          f"intrinsic_pool > 1 needs a state-action agent's own intrinsic net on image "
          f"observations, got agent {self.agent!r}, intrinsic_shares_torso="
          f"{self.intrinsic_shares_torso}, observations of shape {self.obs_shape}"
      )
    if not 1 <= self.n_step < self.buffer_rows:
      raise ValueError(f"n_step must be in [1, buffer_rows), got {self.n_step}")
    if not 0.0 <= self.intrinsic_gamma < 1.0:
      raise ValueError(
          f"intrinsic_gamma must be in [0, 1) (0: gamma), got " f"{self.intrinsic_gamma}"
      )
    if self.num_atoms < 1:
      raise ValueError(f"num_atoms must be positive, got {self.num_atoms}")
    if self.num_atoms > 1 and (heads or not self.v_min < self.v_max):
      raise ValueError(
          f"C51 (num_atoms > 1) needs one head and v_min < v_max, got agent "
          f"{self.agent!r}, [{self.v_min}, {self.v_max}]"
      )
    if not 0.0 <= self.context_augment <= 1.0:
      raise ValueError(f"context_augment must be in [0, 1], got {self.context_augment}")
    if self.context_augment and (self.bonus_kind != "csd" or len(self.obs_shape) != 3):
      raise ValueError(
          "context_augment needs a csd bonus on image observations, got agent "
          f"{self.agent!r} on observations of shape {self.obs_shape}"
      )
    if not (0.0 <= self.priority_exponent and 0.0 <= self.importance_exponent <= 1.0):
      raise ValueError(
          f"need priority_exponent >= 0 and importance_exponent in [0, 1], got "
          f"{self.priority_exponent}, {self.importance_exponent}"
      )
    if not 0.0 < self.mask_prob <= 1.0:
      raise ValueError(f"mask_prob must be in (0, 1], got {self.mask_prob}")
    for name in (
        "num_envs",
        "batch_size",
        "updates_per_step",
        "update_period",
        "target_sync_updates",
        "num_actions",
        "bonus_pool",
        "intrinsic_pool",
    ):
      if getattr(self, name) < 1:
        raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
    if self.mesh is not None:
      from csd_jax import parallel  # pylint: disable=g-import-not-at-top  (a mesh means JAX runs)

      shards = self.mesh.shape[parallel.DATA_AXIS]
      if self.batch_size % shards or (self.bonus_recent_rows and (self.batch_size // 2) % shards):
        raise ValueError(
            f"batch_size {self.batch_size} (and its half, for the bonus's recent "
            f"rows) must divide evenly over the {shards} data shards of the mesh"
        )

  @property
  def bonus_kind(self) -> str:
    """The bonus's estimator: "none", "csd" or "rnd" (``rl.agents``)."""
    return agents.AGENTS[self.agent].bonus

  @property
  def intrinsic_discount(self) -> float:
    """γ of the intrinsic head: ``intrinsic_gamma``, or ``gamma`` when that is 0."""
    return self.intrinsic_gamma or self.gamma

  @property
  def stores_bonus_features(self) -> bool:
    """Whether replay stores each observation's pooled frames (``Replay.features``): the
    state-action bonus on frames pooled by ``bonus_pool`` > 1 reads them at n steps of every
    replayed window, so each stack is pooled once, at collection, not n times per update."""
    return self.state_action and self.bonus_pool > 1 and len(self.obs_shape) == 3

  @property
  def state_action(self) -> bool:
    """The paper's agent (``csd_sa``, and ``rnd_sa`` built alike): a bonus of state-action
    pairs and a separate intrinsic value head with the reward prior."""
    return agents.AGENTS[self.agent].state_action
