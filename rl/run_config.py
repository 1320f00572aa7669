"""A run's config as one typed frozen value: its defaults, its conversion, its check, its identity.

* ``DeepSea`` and ``VizDoom``: every field of a run of ``rl.deepsea`` / ``rl.vizdoom`` with its
  default, in the run's units (env steps summed over the envs, replay transitions); the parts
  ``dqn`` (the learner, every agent), ``bonus`` with ``csd`` or ``rnd``, and ``bdqn`` are
  dataclasses of their own. A field of the same unit as one of ``rl.dqn_config.Config`` takes the
  learner's default. An agent's run holds the parts that ``rl.agents`` lists for it.
* ``config_dict`` and ``from_config``: the ml_collections form (``configs/deepsea.py``,
  ``configs/vizdoom.py`` build theirs from ``profile``) and back. A binary converts its
  ``--config`` once, with ``from_config``, which runs ``check``: the one check of a run config,
  a ``cli.ConfigError`` naming the first bad field in one line.
* ``learner``: the ``rl.dqn_config.Config`` of a run (replay rows and update counts for its envs).
* ``identity`` (what must match to resume a run) and the migration of saved identities:
  ``ADDED_FIELDS`` fills what older runs lack (``same_config``, ``check_identity``).
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, ClassVar

import ml_collections

from rl import agents
from rl import dqn_config
from cmdline import cli

# The learner's defaults, which the run fields of the same unit take.
_LEARNER = {f.name: f.default for f in dataclasses.fields(dqn_config.Config)}


@dataclasses.dataclass(frozen=True)
class DQN:
  """The learner of every agent."""

  num_envs: int = 16  # envs stepped together
  gamma: float = _LEARNER["gamma"]
  n_step: int = _LEARNER["n_step"]
  learning_rate: float = _LEARNER["learning_rate"]  # Adam
  adam_eps: float = _LEARNER["adam_eps"]
  max_grad_norm: float = _LEARNER["max_grad_norm"]
  batch_size: int = _LEARNER["batch_size"]
  updates_per_step: int = _LEARNER["updates_per_step"]  # gradient updates per vectorised step
  update_period: int = _LEARNER["update_period"]  # ... on every this-many-th vectorised step
  target_update_frames: int = 8000  # env steps between target-network syncs
  learning_starts: int = _LEARNER["learning_starts"]  # env steps before the first update
  buffer_size: int = 100_000  # replay capacity in transitions
  prioritized: bool = _LEARNER["prioritized"]  # prioritised replay on Q_ext's per-sample loss,
  priority_exponent: float = _LEARNER["priority_exponent"]  # transitions ∝ (loss + 1e-6)^this,
  importance_exponent: float = _LEARNER["importance_exponent"]  # importance weights' exponent,
  # annealed from this to 1 over the run
  eps_start: float = _LEARNER["eps_start"]  # ε-greedy, decayed linearly
  eps_end: float = _LEARNER["eps_end"]
  act_on_target: bool = _LEARNER["act_on_target"]  # acts on the target heads (dqn_config)
  exploration_fraction: float = 0.1  # over this fraction of total_steps
  num_atoms: int = _LEARNER["num_atoms"]  # > 1: C51, Q_ext a distribution on this many atoms
  v_min: float = _LEARNER["v_min"]  # on [v_min, v_max]
  v_max: float = _LEARNER["v_max"]


@dataclasses.dataclass(frozen=True)
class DeepSeaDQN(DQN):
  q_widths: tuple[int, ...] = (64, 64)  # hidden widths of the Q-network MLP


@dataclasses.dataclass(frozen=True)
class VizDoomDQN(DQN):
  # The Q-net torso: (channels, kernel, stride) per conv, their padding, then dense layers of
  # these widths; or with ``residual``, IMPALA stages (3x3 conv, max-pool, 2 residual blocks)
  # of the convs' channels, their dense layers spectrally normalised with ``spectral_norm``.
  convs: tuple[tuple[int, int, int], ...] = ((16, 3, 2), (32, 3, 2), (32, 3, 2))
  padding: str = "SAME"
  widths: tuple[int, ...] = (256,)
  residual: bool = False
  spectral_norm: bool = False


@dataclasses.dataclass(frozen=True)
class Bonus:
  """The intrinsic reward (agents with a bonus)."""

  coef: float = _LEARNER["bonus_coef"]  # β: weight of the bonus divided by its running std,
  coef_end: float = _LEARNER["bonus_coef_end"]  # decayed linearly to coef_end over
  decay_steps: int = _LEARNER["bonus_decay_steps"]  # this many env steps (0: β = coef)
  reward_prior: float = _LEARNER["reward_prior"]  # state-action: Q̂_in = Q_in + this · r_in
  steady_prior: bool = _LEARNER["steady_prior"]  # state-action: bootstrap prior from a synced copy
  intrinsic_gamma: float = _LEARNER["intrinsic_gamma"]  # state-action: its γ (0: dqn.gamma)
  # state-action: the intrinsic head on the Q-net's torso, trained with it (dqn_config)
  shares_torso: bool = _LEARNER["intrinsic_shares_torso"]
  # state-action on frames: > 1 runs the intrinsic net (the Q-net's) on frames pooled by this
  intrinsic_pool: int = _LEARNER["intrinsic_pool"]
  at_update: bool = _LEARNER["bonus_at_update"]  # the replayed inputs' bonus at each update,
  # else computed once at collection and stored
  center: bool = _LEARNER["bonus_center"]  # subtract its running mean
  floor: bool = _LEARNER["bonus_floor"]  # with center: centred rewards below 0 raised to 0
  floor_std: float = _LEARNER["bonus_floor_std"]  # with floor: the reward's zero sits this
  # many running stds above the mean (only rarer inputs pay)
  recent: int = 0  # half of the bonus's batch from the newest this-many transitions
  pool: int = _LEARNER["bonus_pool"]  # > 1: frames average-pooled by this, flattened (MLPs)
  context_augment: float = _LEARNER["context_augment"]  # CSD on frames: each context augmented
  # with this probability


@dataclasses.dataclass(frozen=True)
class CSD:
  prior_width: int = 256  # hidden width of the prior f (VizDoom's csd: 0, the Q torso's)
  lr: float = _LEARNER["csd_lr"]  # linear CSD: SGD step size of g; deep CSD: Adam's
  tower_widths: tuple[int, ...] = (256,)  # deep CSD's towers φ, ψ (unit-normalised outputs)
  embed_dim: int = _LEARNER["csd_embed_dim"]  # deep CSD's embedding size


@dataclasses.dataclass(frozen=True)
class VizDoomCSD(CSD):
  convs: tuple[tuple[int, int, int], ...] = ()  # deep CSD: of the prior and towers (none: MLPs)


@dataclasses.dataclass(frozen=True)
class RND:
  lr: float = _LEARNER["rnd_lr"]  # the predictor's Adam step size
  dim: int = _LEARNER["rnd_dim"]  # output size of the RND nets


@dataclasses.dataclass(frozen=True)
class VizDoomRND(RND):
  convs: tuple[tuple[int, int, int], ...] = ()  # rnd_sa: its nets' convs (none: MLPs)
  widths: tuple[int, ...] = (256,)  # and dense widths (rnd: the Q torso)


@dataclasses.dataclass(frozen=True)
class BDQN:
  num_heads: int = 10  # K
  prior_scale: float = 3.0  # weight of each head's fixed random prior
  mask_prob: float = 0.5  # a transition trains each head with this probability


@dataclasses.dataclass(frozen=True)
class Pixels:
  """What a VizDoom agent sees and does."""

  size: int = 42  # frames resized to size x size
  stack: int = 6  # frames stacked per observation
  gray: bool = True  # ViZDoom's 8-bit gray, else RGB
  frame_skip: int = 4  # game frames per agent step (must divide 2,100)
  actions: int = 5  # 5: one of my_way_home.cfg's buttons per step (the CSD authors' wrapper);
  # 18: envpool's button combinations


@dataclasses.dataclass(frozen=True)
class RunConfig:
  """The fields of every run."""

  agent: str = "dqn"  # rl.agents.NAMES
  seed: int = 0  # seeds the agent and the envs
  total_steps: int = 100_000
  max_episodes: int = 0  # stop after this many episodes (0: no limit)
  stop_after_solved_episodes: int = -1  # stop this many episodes after the first success
  # stop at bsuite's learning time (rl.records.bsuite_learned_episode): the grade is then final
  stop_when_learned: bool = False
  checkpoint_every: int = 50_000  # env steps; 0: only at the end
  log_every: int = 10_000  # env steps between progress lines
  plot: bool = True  # OUT_DIR/learning_curve.png
  bonus: Bonus | None = None
  bdqn: BDQN | None = None
  # The part classes of the optional parts and ``dqn`` (the subclasses' own).
  PART_TYPES: ClassVar[dict[str, type]] = {}


@dataclasses.dataclass(frozen=True)
class DeepSea(RunConfig):
  """A run of ``rl.deepsea``."""

  num_seeds: int = 1  # > 1: seeds seed .. seed + num_seeds - 1 as one program
  size: int = 10  # N: an N x N grid, N moves per episode
  mapping_seed: int = 42  # the action mapping (bsuite's sweep uses 42)
  chunk_steps: int = 250  # vectorised steps per jitted collect-and-learn call
  dqn: DeepSeaDQN = DeepSeaDQN()
  csd: CSD | None = None
  rnd: RND | None = None
  PART_TYPES: ClassVar[dict[str, type]] = dict(
      dqn=DeepSeaDQN, bonus=Bonus, csd=CSD, rnd=RND, bdqn=BDQN
  )


@dataclasses.dataclass(frozen=True)
class VizDoom(RunConfig):
  """A run of ``rl.vizdoom``."""

  setting: str = "cpu"  # a label (rl.agents.SETTINGS): the fields hold what it chose
  variant: str = "dense"  # rl.agents.VARIANTS
  total_steps: int = 1_000_000
  env_timeout_s: float = 300.0  # an env start / step slower than this is a failure
  pixels: Pixels = Pixels()
  dqn: VizDoomDQN = VizDoomDQN()
  csd: VizDoomCSD | None = None
  rnd: VizDoomRND | None = None
  PART_TYPES: ClassVar[dict[str, type]] = dict(
      dqn=VizDoomDQN, bonus=Bonus, csd=VizDoomCSD, rnd=VizDoomRND, bdqn=BDQN, pixels=Pixels
  )


# ------------------------------------------------------------------------------------------
# The ml_collections form and back.


def profile(cls: type[RunConfig], agent: str) -> RunConfig:
  """``cls``'s defaults for ``agent``, with the parts ``rl.agents`` lists for it."""
  parts = {p: cls.PART_TYPES[p]() for p in agents.AGENTS[agent].parts}
  return cls(agent=agent, **parts)


def to_dict(run: RunConfig) -> dict:
  """``run`` as JSON-able nested dicts (tuples become lists), without the parts it lacks."""
  d = {k: v for k, v in dataclasses.asdict(run).items() if v is not None}
  return json.loads(json.dumps(d))


def config_dict(run: RunConfig) -> ml_collections.ConfigDict:
  """``run`` as a ConfigDict (tuples kept), every field overridable from the command line."""
  return ml_collections.ConfigDict(
      {k: v for k, v in dataclasses.asdict(run).items() if v is not None}
  )


def _as_tuple(value):
  return tuple(_as_tuple(v) for v in value) if isinstance(value, (list, tuple)) else value


def _build(cls: type, d: dict, prefix: str):
  """An instance of ``cls`` from its nested dict ``d``; fields that ``d`` lacks take their
  defaults; a field ``cls`` lacks is a ``cli.ConfigError``."""
  fields = {f.name: f for f in dataclasses.fields(cls)}
  unknown = sorted(set(d) - set(fields))
  if unknown:
    raise cli.ConfigError(
        f"--config.{prefix}{unknown[0]} is not a field of this config; "
        f"fields: {', '.join(fields)}"
    )
  parts = getattr(cls, "PART_TYPES", {})
  kwargs = {}
  for name, value in d.items():
    if name in parts and value is not None:
      if not isinstance(value, dict):
        raise cli.ConfigError(f"--config.{prefix}{name} must be a sub-config, got {value!r}")
      kwargs[name] = _build(parts[name], value, f"{prefix}{name}.")
      continue
    field_default = fields[name].default
    if isinstance(field_default, float) and isinstance(value, int) and not isinstance(value, bool):
      value = float(value)  # a float field given as 1
    elif isinstance(field_default, tuple):
      value = _as_tuple(value)
    kwargs[name] = value
  return cls(**kwargs)


def from_config(cls: type[RunConfig], config: ml_collections.ConfigDict | dict) -> RunConfig:
  """The typed run of ``config`` (a ``configs/`` ConfigDict or its dict), checked (``check``):
  the one conversion of a binary's ``--config``."""
  d = config.to_dict() if isinstance(config, ml_collections.ConfigDict) else dict(config)
  run = _build(cls, d, "")
  check(run)
  return run


# ------------------------------------------------------------------------------------------
# The check.


def check_agent(config: dict | ml_collections.ConfigDict) -> None:
  """``cli.ConfigError`` for an unknown ``agent``, or parts that are not the agent's."""
  cli.check(config, one_of={"agent": agents.NAMES})
  have = {p for p in agents.PARTS if config.get(p) is not None}
  if have != set(agents.AGENTS[config["agent"]].parts):
    raise cli.ConfigError(
        f"--config.agent={config['agent']} does not match the config's sub-configs "
        f"({', '.join(sorted(have)) or 'none'}): pick the agent with its profile, "
        f"--config=configs/<env>.py:{config['agent']}"
    )


def check(run: RunConfig) -> None:
  """Raises ``cli.ConfigError`` naming ``--config.<field>`` for the first bad field: out of
  range, parts that are not the agent's, or a combination the learner cannot run."""
  d = to_dict(run)
  check_agent(d)
  agent = agents.AGENTS[run.agent]
  positive = [
      "total_steps",
      "log_every",
      "dqn.num_envs",
      "dqn.n_step",
      "dqn.learning_rate",
      "dqn.adam_eps",
      "dqn.max_grad_norm",
      "dqn.batch_size",
      "dqn.updates_per_step",
      "dqn.update_period",
      "dqn.target_update_frames",
      "dqn.buffer_size",
      "dqn.num_atoms",
  ]
  non_negative = [
      "max_episodes",
      "seed",
      "checkpoint_every",
      "dqn.learning_starts",
      "dqn.priority_exponent",
  ]
  unit_interval = [
      "dqn.eps_start",
      "dqn.eps_end",
      "dqn.exploration_fraction",
      "dqn.importance_exponent",
  ]
  open_unit_interval = ["dqn.gamma"]
  if run.bonus is not None:
    positive += ["bonus.pool", "bonus.intrinsic_pool"]
    non_negative += [
        f"bonus.{k}"
        for k in ("coef", "coef_end", "decay_steps", "reward_prior", "recent", "floor_std")
    ]
    unit_interval.append("bonus.context_augment")
  if run.csd is not None:
    positive.append("csd.embed_dim")
    non_negative += ["csd.lr", "csd.prior_width"]
  if run.rnd is not None:
    positive += ["rnd.lr", "rnd.dim"]
  if run.bdqn is not None:
    positive.append("bdqn.num_heads")
    non_negative.append("bdqn.prior_scale")
    open_unit_interval.append("bdqn.mask_prob")
  if isinstance(run, DeepSea):
    positive += ["size", "chunk_steps", "num_seeds"]
    non_negative.append("mapping_seed")
  else:
    positive += ["env_timeout_s", "pixels.size", "pixels.stack", "pixels.frame_skip"]
  cli.check(
      d,
      positive=positive,
      non_negative=non_negative,
      unit_interval=unit_interval,
      open_unit_interval=open_unit_interval,
  )
  # What the learner (rl.dqn_config.Config) needs of the fields together.
  if run.bonus is not None and not 0.0 <= run.bonus.intrinsic_gamma < 1.0:
    raise cli.ConfigError(
        f"--config.bonus.intrinsic_gamma must be in [0, 1) (0: dqn.gamma), got "
        f"{run.bonus.intrinsic_gamma!r}"
    )
  if agent.state_action and not run.bonus.at_update:
    raise cli.ConfigError(
        f"--config.bonus.at_update must be True for {run.agent} (every action's bonus is "
        "scored at update time)"
    )
  if run.bonus is not None and (run.bonus.shares_torso or run.bonus.intrinsic_pool > 1):
    b = run.bonus
    if not agent.state_action or (b.shares_torso and b.intrinsic_pool > 1):
      raise cli.ConfigError(
          f"--config.bonus.shares_torso and bonus.intrinsic_pool > 1 each need a state-action "
          f"agent's intrinsic head and exclude each other, got agent {run.agent}, shares_torso="
          f"{b.shares_torso}, intrinsic_pool={b.intrinsic_pool}"
      )
    if b.intrinsic_pool > 1 and isinstance(run, DeepSea):
      raise cli.ConfigError("--config.bonus.intrinsic_pool > 1 pools frames (VizDoom)")
  if run.bonus is not None and run.bonus.floor and not run.bonus.center:
    raise cli.ConfigError(
        "--config.bonus.floor needs --config.bonus.center=True (uncentred rewards are never "
        "negative)"
    )
  if run.bdqn is not None and run.bdqn.num_heads < 2:
    raise cli.ConfigError(f"--config.bdqn.num_heads must be >= 2, got {run.bdqn.num_heads}")
  if run.dqn.num_atoms > 1 and (agent.heads or not run.dqn.v_min < run.dqn.v_max):
    raise cli.ConfigError(
        f"--config.dqn.num_atoms={run.dqn.num_atoms} (C51) needs one head and "
        f"dqn.v_min < dqn.v_max, got agent {run.agent}, [{run.dqn.v_min}, {run.dqn.v_max}]"
    )
  if (
      run.bonus is not None
      and run.bonus.context_augment
      and (agent.bonus != "csd" or isinstance(run, DeepSea))
  ):
    raise cli.ConfigError(
        f"--config.bonus.context_augment needs a csd bonus on frames (VizDoom), got agent "
        f"{run.agent} on {type(run).__name__}"
    )
  if isinstance(run, VizDoom):
    _check_vizdoom(run, d)


def _check_vizdoom(run: VizDoom, d: dict) -> None:
  """The VizDoom fields of ``check``."""
  from rl import doom_env  # pylint: disable=g-import-not-at-top  (its env constants)

  if run.setting == agents.AUTO:
    raise cli.ConfigError(
        f"--config.setting is {agents.AUTO!r} (a profile without a setting), which is decided "
        "at start-up: pass the config through rl.vizdoom.resolve_setting first, or name the "
        "setting in the profile"
    )
  cli.check(
      d,
      one_of={
          "variant": agents.VARIANTS,
          "setting": agents.SETTINGS,
          "pixels.actions": doom_env.DOOM_ACTION_SETS,
      },
  )
  if doom_env.EPISODE_FRAMES % run.pixels.frame_skip:
    raise cli.ConfigError(
        f"--config.pixels.frame_skip must divide the {doom_env.EPISODE_FRAMES}-frame episode cap, "
        f"got {run.pixels.frame_skip}"
    )
  if run.dqn.spectral_norm and not run.dqn.residual:
    raise cli.ConfigError(
        "--config.dqn.spectral_norm needs the IMPALA Q-net (--config.dqn.residual=True)"
    )


# ------------------------------------------------------------------------------------------
# The learner.


def learner(
    run: RunConfig,
    *,
    obs_shape: tuple[int, ...],
    num_actions: int,
    q_spec: Any,
    bonus_spec: Any,
    shared_torso: bool,
    mesh=None,
    csd_towers: Any = None,
) -> dqn_config.Config:
  """The learner ``Config`` of ``run``: the fields of the same unit as they are; env-step
  counts and transitions turned into update counts and replay rows for ``run.dqn.num_envs``
  envs (``bonus.recent`` -> ``bonus_recent_rows``, ``dqn.buffer_size`` -> ``buffer_rows``,
  ``dqn.target_update_frames`` -> ``target_sync_updates``, ``dqn.exploration_fraction`` ->
  ``eps_decay_steps``). ``csd_towers``: deep CSD's towers (None: linear CSD)."""
  d = run.dqn
  e, u, n = d.num_envs, d.updates_per_step, d.n_step
  extra = {}
  if run.bonus is not None:
    b = run.bonus
    extra.update(
        bonus_coef=b.coef,
        bonus_coef_end=b.coef_end,
        bonus_decay_steps=b.decay_steps,
        reward_prior=b.reward_prior,
        steady_prior=b.steady_prior,
        intrinsic_gamma=b.intrinsic_gamma,
        intrinsic_shares_torso=b.shares_torso,
        intrinsic_pool=b.intrinsic_pool,
        bonus_at_update=b.at_update,
        bonus_center=b.center,
        bonus_floor=b.floor,
        bonus_floor_std=b.floor_std,
        bonus_recent_rows=math.ceil(b.recent / e),
        bonus_pool=b.pool,
        context_augment=b.context_augment,
    )
  if run.csd is not None:
    extra.update(csd_lr=run.csd.lr, csd_towers=csd_towers, csd_embed_dim=run.csd.embed_dim)
  if run.rnd is not None:
    extra.update(rnd_dim=run.rnd.dim, rnd_lr=run.rnd.lr)
  if run.bdqn is not None:
    extra.update(
        num_heads=run.bdqn.num_heads,
        prior_scale=run.bdqn.prior_scale,
        mask_prob=run.bdqn.mask_prob,
    )
  return dqn_config.Config(
      agent=run.agent,
      num_actions=num_actions,
      obs_shape=tuple(obs_shape),
      num_envs=e,
      q_spec=q_spec,
      bonus_spec=bonus_spec,
      shared_torso=shared_torso,
      gamma=d.gamma,
      n_step=n,
      learning_rate=d.learning_rate,
      adam_eps=d.adam_eps,
      max_grad_norm=d.max_grad_norm,
      num_atoms=d.num_atoms,
      v_min=d.v_min,
      v_max=d.v_max,
      batch_size=d.batch_size,
      updates_per_step=u,
      update_period=d.update_period,
      target_sync_updates=max(1, round(d.target_update_frames * u / (e * d.update_period))),
      learning_starts=d.learning_starts,
      buffer_rows=max(n + 2, math.ceil(d.buffer_size / e)),
      prioritized=d.prioritized,
      priority_exponent=d.priority_exponent,
      importance_exponent=d.importance_exponent,
      # annealed over the run; 0 (unread) without prioritised replay, so that runs of any
      # total_steps share one Config and its compiled functions
      importance_anneal_steps=run.total_steps if d.prioritized else 0,
      eps_start=d.eps_start,
      eps_end=d.eps_end,
      act_on_target=d.act_on_target,
      # a constant ε needs no decay length, for the same reason
      eps_decay_steps=(
          1 if d.eps_start == d.eps_end else max(1, int(d.exploration_fraction * run.total_steps))
      ),
      mesh=mesh,
      **extra,
  )


# ------------------------------------------------------------------------------------------
# A run's identity and the migration of saved ones.

# Fields that change what a run reports and how it guards itself, not its results.
REPORTING = ("checkpoint_every", "log_every", "plot", "env_timeout_s")
# Fields a resumed run may change: how long it runs and what it reports.
RESUMABLE = (
    "total_steps",
    "max_episodes",
    "stop_after_solved_episodes",
    "stop_when_learned",
    *REPORTING,
)

# Run-config fields added after runs were recorded, each with the value every earlier run had
# (a record of those runs, not a default): a saved config (a run's checkpoint, a finished cell's
# summary) that lacks one matches a current config holding that value. The bonus, csd and rnd
# fields that a profile did not state were unread by its agent (a next-observation bonus has no
# decay, reward prior or pooling; linear CSD no towers; the VizDoom csd and rnd agents' nets
# are the Q torso).
ADDED_FIELDS = {
    ("dqn", "num_atoms"): 1,
    ("dqn", "v_min"): -1.0,
    ("dqn", "v_max"): 1.0,
    ("dqn", "residual"): False,
    ("dqn", "prioritized"): False,
    ("dqn", "priority_exponent"): 0.5,
    ("dqn", "importance_exponent"): 0.45,
    ("dqn", "spectral_norm"): False,
    ("dqn", "act_on_target"): False,
    ("dqn", "update_period"): 1,
    ("bonus", "steady_prior"): False,
    ("bonus", "shares_torso"): False,
    ("bonus", "intrinsic_pool"): 1,
    ("bonus", "floor"): False,
    ("bonus", "floor_std"): 0.0,
    ("bonus", "coef_end"): 0.0,
    ("bonus", "decay_steps"): 0,
    ("bonus", "reward_prior"): 0.5,
    ("bonus", "intrinsic_gamma"): 0.0,
    ("bonus", "pool"): 1,
    ("bonus", "context_augment"): 0.0,
    ("csd", "tower_widths"): [256],
    ("csd", "embed_dim"): 64,
    ("csd", "convs"): [],
    ("rnd", "convs"): [],
    ("rnd", "widths"): [256],
    ("pixels", "actions"): 18,  # VizDoom: envpool's 18 combined actions
    ("num_seeds",): 1,  # DeepSea: one seed per run
    ("stop_when_learned",): False,
}


def identity(run: RunConfig) -> dict:
  """What must match for a checkpoint to be resumed: ``run`` (``to_dict``) but ``RESUMABLE``."""
  return {k: v for k, v in to_dict(run).items() if k not in RESUMABLE}


def _comparable(saved: dict, current: dict) -> tuple[dict, dict]:
  """Both configs without ``REPORTING`` fields, ``saved`` (a copy) given the ``ADDED_FIELDS``
  that it lacks and ``current`` has."""
  saved = {k: v for k, v in json.loads(json.dumps(saved)).items() if k not in REPORTING}
  current = {k: v for k, v in json.loads(json.dumps(current)).items() if k not in REPORTING}
  for (*parents, name), value in ADDED_FIELDS.items():
    node, now = saved, current
    for parent in parents:
      node = node.get(parent) if isinstance(node, dict) else None
      now = now.get(parent) if isinstance(now, dict) else None
    if isinstance(node, dict) and isinstance(now, dict) and name in now:
      node.setdefault(name, value)
  return saved, current


def same_config(saved: dict, current: dict) -> bool:
  """Whether a saved run config (a nested dict) is ``current``, ``REPORTING`` fields aside,
  reading the fields that it lacks and ``current`` has from ``ADDED_FIELDS``."""
  saved, current = _comparable(saved, current)
  return saved == current


def config_differences(saved: dict, current: dict) -> list[str]:
  """Where ``same_config`` finds them different: "path saved S, now C" per differing field
  (``ADDED_FIELDS`` read as there; a missing field shows as None)."""

  def walk(a, b, prefix):
    if isinstance(a, dict) and isinstance(b, dict):
      return [
          d
          for k in sorted(set(a) | set(b), key=str)
          for d in walk(a.get(k), b.get(k), f"{prefix}{k}.")
      ]
    return [] if a == b else [f"{prefix[:-1]} saved {a!r}, now {b!r}"]

  return walk(*_comparable(saved, current), "")


def check_identity(saved: dict | None, identity_now: dict, what: str, remedy: str) -> None:
  """``cli.ConfigError`` in one line (``what (differences): remedy``) when a saved run identity
  is not ``identity_now`` (``same_config``); nothing when nothing was saved."""
  if saved is not None and not same_config(saved, identity_now):
    raise cli.ConfigError(
        f"{what} ({'; '.join(config_differences(saved, identity_now))}): {remedy}"
    )
