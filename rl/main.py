r"""Train one DQN-family agent on DeepSea or VizDoom MyWayHome; resumable.

    python -m rl.main --env=deepsea --deepsea_size=20 --agent=csd --total_steps=70000 \
        --seed=0 --out_dir=/tmp/ds20_csd
    python -m rl.main --env=doom_dense --agent=csd --total_steps=2000000 --out_dir=/tmp/doom

Agents (``rl.dqn``): ``dqn`` (ε-greedy double DQN), ``csd`` / ``rnd`` (DQN + intrinsic bonus,
``rl.bonus``), ``bdqn`` (bootstrapped DQN with randomised prior functions). Every
hyper-parameter is a flag; flags left unset take the environment's default (``DEFAULTS``:
VizDoom close to the CSD authors' setup, DeepSea close to bsuite's baselines, adapted to
vectorised envs). Steps are environment steps summed over the vectorised envs (``frames``
below means the same; envpool's frame skip of 4 is not counted).

Writes into ``--out_dir``: ``summary.json`` (``solved``: goal reached at least once,
``first_success_step``, ``first_success_episode``, ``success_rate_last_100``, ``sps`` (agent env
steps/s, learning included), ``env_sps`` (raw env steps/s, random actions), ``episodes``, ...),
``learning_curve.png``, ``tb/`` (TensorBoard scalars), ``checkpoints/`` (orbax: the whole agent
state, i.e. params, optimizer state, replay buffer, counters and RNG, plus the DeepSea env state
and the episode statistics). Rerunning with the same flags resumes from the latest checkpoint;
a larger ``--total_steps`` continues training. envpool's state cannot be saved: a resumed VizDoom
run resets its envs and marks the last stored transition invalid.

DeepSea runs fully jitted (collect + learn under ``lax.scan``, ``--chunk_steps`` vectorised steps
per call); VizDoom steps envpool from Python and calls the jitted ``observe`` / ``learn``.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
from absl import app
from absl import flags
from absl import logging

from uncertainty_kit import flag_checks
from uncertainty_kit import launch
from rl import envs

ENVS = ("deepsea", "doom_dense", "doom_sparse", "doom_very_sparse")
AGENTS = ("dqn", "csd", "rnd", "bdqn")

# Per-environment defaults of every hyper-parameter flag left unset ("agent:" keys override for
# one agent). VizDoom: the authors' setup (γ 0.997, 10-step returns, Adam 2.5e-4, clip 10,
# target sync every 8,000 frames, ε 1 -> 0.01). DeepSea: bsuite's DQN / BootDQN baselines
# (Adam 1e-3, γ 0.99, batch 128, K = 10 heads with prior scale 3 and mask prob 0.5), with 4
# envs stepping together and one update per vectorised step. Why only 4 envs: all envs of a
# greedy agent walk the same path until the next update, so more envs cost *episodes*. Measured
# (DeepSea-20, 3,000 episodes, 2 CPU cores): BDQN+P with 16 envs solved 0/3 seeds (deepest
# last-row column 15), with 4 envs 2/2 (first success at episodes 1508 and 1836).
# DeepSea dqn / csd / rnd (shared keys, so all three get them): 1-step targets, a constant
# ε = 0.1 and bonus_coef 0.3. A next-observation bonus only reaches Q through transitions already
# taken, so an untried action at the edge of the visited region is found by ε alone; measured
# (csd, DeepSea-20, seeds 0-1): with ε 0.1 -> 0.01 and 3-step returns the agent sat for 1,000+
# episodes at depth 6-7 (0/5 seeds solved; 3-step returns follow the behaviour path, not the
# novel branch), with ε = 0 it never tried the novel branch (0/2), with a constant 0.1 and
# 1-step targets 2/2 (episodes 1767, 1671), and with bonus_coef 0.3 2/2 (1463, 1371).
DEFAULTS: dict[str, dict[str, Any]] = {
    "deepsea": dict(
        num_envs=4, gamma=0.99, n_step=1, learning_rate=1e-3, adam_eps=1.5e-4, max_grad_norm=10.0,
        batch_size=128, updates_per_step=1, target_update_frames=32, learning_starts=512,
        buffer_size=100_000, eps_start=0.1, eps_end=0.1, exploration_fraction=0.1,
        q_widths="64,64", bonus_coef=0.3, bonus_at_update=True, bonus_center=True,
        bonus_recent=400, num_heads=10, prior_scale=3.0, mask_prob=0.5, csd_prior_width=256,
        csd_lr=1.0, rnd_lr=1e-3, rnd_dim=64, chunk_steps=250,
        **{"bdqn:target_update_frames": 16, "bdqn:eps_start": 0.0, "bdqn:eps_end": 0.0}),
    "doom": dict(
        num_envs=8, gamma=0.997, n_step=10, learning_rate=2.5e-4, adam_eps=1.5e-4,
        max_grad_norm=10.0, batch_size=32, updates_per_step=2, target_update_frames=8000,
        learning_starts=10_000, buffer_size=100_000, eps_start=1.0, eps_end=0.01,
        exploration_fraction=0.1, q_widths="", bonus_coef=0.1, bonus_at_update=False,
        bonus_center=False, bonus_recent=0, num_heads=10, prior_scale=1.0, mask_prob=0.5,
        csd_prior_width=0, csd_lr=0.05, rnd_lr=1e-4,
        rnd_dim=64, chunk_steps=1, **{"bdqn:eps_start": 0.0, "bdqn:eps_end": 0.0}),
}
HPARAMS = ("num_envs", "gamma", "n_step", "learning_rate", "adam_eps", "max_grad_norm",
           "batch_size", "updates_per_step", "target_update_frames", "learning_starts",
           "buffer_size", "eps_start", "eps_end", "exploration_fraction", "q_widths",
           "bonus_coef", "bonus_at_update", "bonus_center", "bonus_recent", "num_heads",
           "prior_scale", "mask_prob", "csd_prior_width", "csd_lr", "rnd_lr", "rnd_dim",
           "chunk_steps")


@dataclasses.dataclass
class RunConfig:
  """One run: what the flags say (``None`` hyper-parameters take ``DEFAULTS``)."""
  env: str = "deepsea"
  agent: str = "dqn"
  total_steps: int = 100_000
  max_episodes: int = 0              # stop after this many episodes (0: no limit)
  stop_after_solved_episodes: int = -1  # stop this many episodes after the first success
  seed: int = 0
  out_dir: str = "/tmp/csd_rl"
  deepsea_size: int = 10
  mapping_seed: int = 42             # DeepSea action mapping (bsuite's sweep uses 42)
  checkpoint_every: int = 50_000     # env steps; 0: only at the end
  checkpoint_dir: str | None = None  # None: OUT_DIR/checkpoints
  log_every: int = 10_000            # env steps
  tensorboard: bool = True
  plot: bool = True
  verbose: bool = True
  hparams: dict = dataclasses.field(default_factory=dict)
  mesh: str = ""                     # e.g. "data=8": data-parallel updates (not in identity)
  env_timeout_s: float = 300.0       # VizDoom: a reset/step slower than this is a failure

  def resolved(self) -> dict[str, Any]:
    """The hyper-parameters with defaults filled in."""
    if self.env not in ENVS:
      raise ValueError(f"env must be one of {ENVS}, got {self.env!r}")
    if self.agent not in AGENTS:
      raise ValueError(f"agent must be one of {AGENTS}, got {self.agent!r}")
    table = DEFAULTS["deepsea" if self.env == "deepsea" else "doom"]
    out = {}
    for name in HPARAMS:
      value = self.hparams.get(name)
      if value is None:
        value = table.get(f"{self.agent}:{name}", table[name])
      out[name] = value
    unknown = set(self.hparams) - set(HPARAMS)
    if unknown:
      raise ValueError(f"unknown hyper-parameters {sorted(unknown)}")
    return out

  def identity(self) -> dict[str, Any]:
    """What must match for a checkpoint to be resumed."""
    return dict(env=self.env, agent=self.agent, seed=self.seed,
                deepsea_size=self.deepsea_size if self.env == "deepsea" else None,
                mapping_seed=self.mapping_seed if self.env == "deepsea" else None,
                hparams=self.resolved())


# ------------------------------------------------------------------------------------------
# Environment and agent construction.


@functools.lru_cache(maxsize=16)
def deep_sea(size: int, num_envs: int, mapping_seed: int):
  """Cached (reset, step) of ``rl.envs.deep_sea_fns``: one closure per MDP, so compiled
  training chunks are reused across seeds."""
  return envs.deep_sea_fns(size, num_envs, mapping_seed=mapping_seed)


def env_spec(run: RunConfig) -> tuple[tuple[int, ...], int]:
  """(obs_shape, num_actions)."""
  if run.env == "deepsea":
    return (run.deepsea_size ** 2,), 2
  return envs.DOOM_OBS_SHAPE, envs.DOOM_NUM_ACTIONS


def agent_config(run: RunConfig):
  """The ``rl.dqn.Config`` of a run."""
  from csd_jax import models
  from csd_jax import parallel
  from rl import dqn
  from rl import networks

  hp = run.resolved()
  obs_shape, num_actions = env_spec(run)
  e, u = int(hp["num_envs"]), int(hp["updates_per_step"])
  pixels = run.env != "deepsea"
  if pixels:
    q_spec = networks.nature_dqn_spec(num_actions)
    bonus_spec = (models.NATURE_DQN_TORSO if run.agent == "csd"
                  else networks.nature_dqn_spec(1) if run.agent == "rnd" else None)
  else:
    widths = tuple(int(w) for w in str(hp["q_widths"]).split(",") if w)
    q_spec = networks.mlp_spec(widths, num_actions)
    bonus_spec = (models.MLPSpec(widths=(int(hp["csd_prior_width"]),), out_dim=1)
                  if run.agent == "csd"
                  else networks.mlp_spec(widths, 1) if run.agent == "rnd" else None)
  if pixels and run.agent == "csd" and int(hp["csd_prior_width"]) > 0:
    bonus_spec = dataclasses.replace(bonus_spec, widths=(int(hp["csd_prior_width"]),))
  bdqn = run.agent == "bdqn"
  return dqn.Config(
      agent=run.agent, num_actions=num_actions, obs_shape=obs_shape, num_envs=e,
      q_spec=q_spec, bonus_spec=bonus_spec,
      num_heads=int(hp["num_heads"]) if bdqn else 1, shared_torso=pixels,
      prior_scale=float(hp["prior_scale"]) if bdqn else 0.0,
      mask_prob=float(hp["mask_prob"]) if bdqn else 1.0,
      gamma=float(hp["gamma"]), n_step=int(hp["n_step"]),
      learning_rate=float(hp["learning_rate"]), adam_eps=float(hp["adam_eps"]),
      max_grad_norm=float(hp["max_grad_norm"]), batch_size=int(hp["batch_size"]),
      updates_per_step=u,
      target_sync_updates=max(1, round(int(hp["target_update_frames"]) * u / e)),
      learning_starts=int(hp["learning_starts"]),
      buffer_rows=max(int(hp["n_step"]) + 2, math.ceil(int(hp["buffer_size"]) / e)),
      eps_start=float(hp["eps_start"]), eps_end=float(hp["eps_end"]),
      eps_decay_steps=max(1, int(float(hp["exploration_fraction"]) * run.total_steps)),
      bonus_coef=float(hp["bonus_coef"]) if run.agent in ("csd", "rnd") else 0.0,
      bonus_at_update=bool(hp["bonus_at_update"]), bonus_center=bool(hp["bonus_center"]),
      bonus_recent_rows=math.ceil(int(hp["bonus_recent"]) / e), csd_lr=float(hp["csd_lr"]),
      rnd_dim=int(hp["rnd_dim"]), rnd_lr=float(hp["rnd_lr"]),
      mesh=parallel.make_mesh(run.mesh) if run.mesh else None)


# ------------------------------------------------------------------------------------------
# Episode statistics (numpy, both drivers).


class Episodes:
  """Per-episode records from vectorised step outputs."""

  def __init__(self, num_envs: int):
    self.running = np.zeros(num_envs, np.float64)
    self.end_step: list[int] = []     # env steps at the episode's last step
    self.success: list[bool] = []
    self.ret: list[float] = []

  def add_rows(self, env_steps_before: int, reward, done, success, valid) -> None:
    """Rows of (T, E) step outputs; ``env_steps_before``: env steps before the first row."""
    reward, done, success, valid = (np.asarray(a) for a in (reward, done, success, valid))
    e = reward.shape[1]
    for t in range(reward.shape[0]):
      self.running += np.where(valid[t], reward[t], 0.0)
      if done[t].any():
        for i in np.flatnonzero(done[t]):
          self.end_step.append(env_steps_before + (t + 1) * e)
          self.success.append(bool(success[t, i]))
          self.ret.append(float(self.running[i]))
        self.running[done[t]] = 0.0

  @property
  def count(self) -> int:
    return len(self.end_step)

  def first_success(self) -> tuple[int | None, int | None]:
    """(env step, 1-based episode number) of the first success, or (None, None)."""
    if not any(self.success):
      return None, None
    i = self.success.index(True)
    return self.end_step[i], i + 1

  def last(self, values: list, n: int = 100) -> float | None:
    return float(np.mean(values[-n:])) if values else None

  def state(self) -> dict:
    return dict(running=self.running.tolist(), end_step=self.end_step,
                success=[int(s) for s in self.success], ret=self.ret)

  def load(self, d: dict) -> None:
    self.running = np.asarray(d["running"], np.float64)
    self.end_step = [int(s) for s in d["end_step"]]
    self.success = [bool(s) for s in d["success"]]
    self.ret = [float(r) for r in d["ret"]]


# ------------------------------------------------------------------------------------------
# Checkpoints (orbax).


def _manager(out_dir: Path, checkpoint_dir: str | None = None):
  from csd_jax import checkpoint
  return checkpoint.manager(Path(checkpoint_dir) if checkpoint_dir else out_dir / "checkpoints")


# ------------------------------------------------------------------------------------------
# Logging and outputs.


class Logger:
  def __init__(self, run: RunConfig, out_dir: Path):
    self.run, self.writer = run, None
    if run.tensorboard:  # TF-free: TensorFlow is never imported (rl.event_writer says why)
      from rl.event_writer import ScalarWriter
      self.writer = ScalarWriter(out_dir / "tb")

  def log(self, env_steps: int, scalars: dict[str, float], line: str) -> None:
    if self.writer is not None:
      for k, v in scalars.items():
        if v is not None and np.isfinite(v):
          self.writer.add_scalar(k, float(v), env_steps)
      self.writer.flush()
    if self.run.verbose:
      print(line, file=sys.stderr, flush=True)

  def close(self) -> None:
    if self.writer is not None:
      self.writer.close()


def plot_learning_curve(path: Path, episodes: Episodes, title: str) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
  if episodes.count:
    x = np.asarray(episodes.end_step)
    s = np.asarray(episodes.success, np.float64)
    r = np.asarray(episodes.ret)
    w = min(100, len(s))
    kernel = np.ones(w) / w
    ax1.plot(x[w - 1:], np.convolve(s, kernel, "valid"))
    ax2.plot(x[w - 1:], np.convolve(r, kernel, "valid"))
    first, _ = episodes.first_success()
    if first is not None:
      for ax in (ax1, ax2):
        ax.axvline(first, color="k", ls=":", lw=1, label="first success")
      ax1.legend(loc="upper left")
  ax1.set_ylabel(f"success rate\n(last {100} episodes)")
  ax2.set_ylabel("extrinsic return\n(last 100 episodes)")
  ax2.set_xlabel("environment steps")
  ax1.set_title(title)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


# ------------------------------------------------------------------------------------------
# Raw env throughput.


def deep_sea_env_sps(size: int, num_envs: int, mapping_seed: int, num_steps: int = 2000) -> float:
  """Raw DeepSea env steps/s (random actions, jitted scan), compile excluded."""
  import jax
  reset, step = deep_sea(size, num_envs, mapping_seed)

  @jax.jit
  def run(key):
    state, _ = reset(key)
    def body(carry, k):
      state, acc = carry
      a = jax.random.randint(k, (num_envs,), 0, 2)
      state, out = step(state, a)
      return (state, acc + out.reward.sum()), None
    return jax.lax.scan(body, (state, 0.0), jax.random.split(key, num_steps))[0][1]

  run(jax.random.PRNGKey(0)).block_until_ready()
  t = time.perf_counter()
  run(jax.random.PRNGKey(1)).block_until_ready()
  return num_steps * num_envs / (time.perf_counter() - t)


# ------------------------------------------------------------------------------------------
# Training.


def _stop(run: RunConfig, env_steps: int, episodes: Episodes) -> bool:
  if env_steps >= run.total_steps:
    return True
  if run.max_episodes and episodes.count >= run.max_episodes:
    return True
  if run.stop_after_solved_episodes >= 0:
    _, first_ep = episodes.first_success()
    if first_ep is not None and episodes.count >= first_ep + run.stop_after_solved_episodes:
      return True
  return False


def train(run: RunConfig) -> dict:
  """Runs (or resumes) one training run; returns the summary (also written to summary.json).

  A VizDoom env is closed (its games ended) on every way out but a hung env, which the caller
  should end with ``exit_on_env_failure`` (see ``rl.envs.Watchdog``).
  """
  opened: list = []
  try:
    return _train(run, opened)
  finally:
    for env in opened:
      if not env.hung:
        env.close()


def _train(run: RunConfig, opened: list) -> dict:
  """``train``'s body; appends the VizDoom env it starts to ``opened``."""
  import jax
  import jax.numpy as jnp
  from csd_jax import checkpoint
  from rl import dqn
  from rl import replay as replay_lib

  out_dir = Path(run.out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  cfg = agent_config(run)
  hp = run.resolved()
  identity = run.identity()
  (out_dir / "config.json").write_text(json.dumps(
      dict(identity, total_steps=run.total_steps, max_episodes=run.max_episodes), indent=1,
      default=str))
  logger = Logger(run, out_dir)
  mngr = _manager(out_dir, run.checkpoint_dir)
  episodes = Episodes(cfg.num_envs)
  key = jax.random.PRNGKey(run.seed)
  k_env, k_agent = jax.random.split(key)
  deepsea = run.env == "deepsea"
  title = (f"{run.agent} on DeepSea-{run.deepsea_size}" if deepsea
           else f"{run.agent} on {run.env}") + f", seed {run.seed}"

  # --- environment and initial state
  if deepsea:
    reset, env_step = deep_sea(run.deepsea_size, cfg.num_envs, run.mapping_seed)
    env_state, obs = reset(k_env)
    obs = obs.astype(jnp.float32)
    env = None
    env_sps = deep_sea_env_sps(run.deepsea_size, cfg.num_envs, run.mapping_seed)
  else:
    variant = run.env[len("doom_"):]
    # a private working folder for ViZDoom's _vizdoom* files (parallel starts race on them);
    # the start itself is under the watchdog too (rl.envs.start_doom)
    env = envs.start_doom(variant, cfg.num_envs, run.seed, timeout_s=run.env_timeout_s,
                          work_dir=out_dir / "vizdoom")
    opened.append(env)
    env_sps = envs.measure_steps_per_second(env, max(1, 400 // cfg.num_envs), seed=run.seed)
    obs, _ = env.reset()
    env_state = None
  agent = dqn.init(cfg, k_agent, jnp.asarray(obs))
  agent, actions = dqn.first_actions(cfg, agent, jnp.asarray(obs))
  tree = dict(agent=agent) if not deepsea else dict(
      loop=dqn.EnvLoop(agent, env_state, jnp.asarray(obs), actions))

  # --- resume
  resumed_from = None
  wall_before = 0.0
  restored = checkpoint.restore_latest(mngr, jax.tree.map(lambda x: x, tree))
  if restored is not None:
    tree, meta = restored
    if meta["identity"] != checkpoint.jsonable(identity):
      raise ValueError(f"{out_dir}: the checkpoint was written with different flags:\n"
                       f"  saved: {meta['identity']}\n  now:   {identity}\n"
                       "use another --out_dir or the same flags")
    episodes.load(meta["episodes"])
    resumed_from = int(meta["env_steps"])
    wall_before = float(meta.get("wall_s", 0.0))
    if not deepsea:  # envpool cannot be restored: new episodes, drop the dangling transition
      agent = tree["agent"]
      agent = agent._replace(replay=replay_lib.invalidate_last(agent.replay))
      agent, actions = dqn.first_actions(cfg, agent, jnp.asarray(obs))
      episodes.running[:] = 0.0
      tree = dict(agent=agent)
    if run.verbose:
      print(f"resumed from {out_dir / 'checkpoints'} at env step {resumed_from} "
            f"({episodes.count} episodes)", file=sys.stderr, flush=True)

  def env_steps_of(tree) -> int:
    a = tree["loop"].agent if deepsea else tree["agent"]
    return int(a.env_steps)

  def save(tree, wall):
    meta = dict(identity=identity, env_steps=env_steps_of(tree), episodes=episodes.state(),
                wall_s=wall)
    checkpoint.save(mngr, env_steps_of(tree), tree, meta)

  # --- loop
  metrics_acc: dict[str, list] = {}
  t_start = time.perf_counter()
  t_timed, steps_timed = None, 0       # SPS clock starts after the first (compiling) call
  next_log = env_steps_of(tree) + run.log_every
  next_ckpt = env_steps_of(tree) + (run.checkpoint_every or float("inf"))
  last_log_t, last_log_steps = time.perf_counter(), env_steps_of(tree)

  if cfg.mesh is not None:  # params, replay and env state on every device of the mesh
    from csd_jax import parallel
    tree = parallel.replicate(cfg.mesh, tree)

  if deepsea:
    chunk = dqn.make_chunk(cfg, env_step, int(hp["chunk_steps"]))
  else:
    observe = jax.jit(functools.partial(dqn.observe, cfg), donate_argnums=0)
    # readiness decided on the host (a static argument): see dqn.learn on lax.cond and XLA:CPU
    learn = jax.jit(functools.partial(dqn.learn, cfg), static_argnums=1, donate_argnums=0)
    ready_to_learn = jax.jit(functools.partial(dqn.ready_to_learn, cfg))
    agent = tree["agent"]
    obs_dev = jnp.asarray(obs)

  while not _stop(run, env_steps_of(tree) if deepsea else int(agent.env_steps), episodes):
    if deepsea:
      before = env_steps_of(tree)
      loop, rec = chunk(tree["loop"])
      tree = dict(loop=loop)
      rec = jax.device_get(rec)
      episodes.add_rows(before, rec["reward"], rec["done"], rec["success"], rec["valid"])
      now = env_steps_of(tree)
      upd = rec["updated"] > 0
      for k in dqn.metric_names(cfg):
        if upd.any():
          metrics_acc.setdefault(k, []).append(float(np.mean(rec[k][upd])))
    else:
      before = int(agent.env_steps)
      try:
        out = env.step(np.asarray(actions))
      except envs.EnvFailure as e:  # keep what was learned, then stop (never hang)
        save(dict(agent=agent), wall_before + time.perf_counter() - t_start)
        raise envs.EnvFailure(
            f"{e}; stopped at env step {before}, checkpoint saved in {mngr.directory}: "
            "rerun with the same flags to resume") from e
      next_obs = jnp.asarray(out.obs)
      agent, actions = observe(agent, obs_dev, actions, next_obs, jnp.asarray(out.reward),
                               jnp.asarray(out.done), jnp.asarray(out.info["terminated"]),
                               jnp.asarray(out.valid))
      # dispatched asynchronously: the next env.step overlaps it
      agent, m = learn(agent, bool(ready_to_learn(agent)))
      obs_dev = next_obs
      episodes.add_rows(before, out.reward[None], out.done[None], out.success[None],
                        out.valid[None])
      now = before + cfg.num_envs
      if now >= next_log:
        m = jax.device_get(m)
        if m["updated"] > 0:
          for k in dqn.metric_names(cfg):
            metrics_acc.setdefault(k, []).append(float(m[k]))
      tree = dict(agent=agent)
    if t_timed is None:
      t_timed = last_log_t = time.perf_counter()
      last_log_steps = now
    else:
      steps_timed += now - before

    if now >= next_log or _stop(run, now, episodes):
      t = time.perf_counter()
      sps_now = (now - last_log_steps) / max(t - last_log_t, 1e-9)
      last_log_t, last_log_steps = t, now
      first, first_ep = episodes.first_success()
      sr, ret = episodes.last(episodes.success), episodes.last(episodes.ret)
      scalars = {"charts/episodes": episodes.count, "charts/success_rate_100": sr,
                 "charts/return_100": ret, "charts/sps": sps_now, "charts/env_sps": env_sps,
                 "charts/epsilon": float(dqn.epsilon(cfg, jnp.asarray(now)))}
      scalars.update({f"losses/{k}": float(np.mean(v)) for k, v in metrics_acc.items()})
      line = (f"[{run.agent} {run.env}{'-' + str(run.deepsea_size) if deepsea else ''} "
              f"seed {run.seed}] step {now}/{run.total_steps} | episodes {episodes.count} | "
              f"success_100 {sr if sr is not None else float('nan'):.2f} | "
              f"first_success {first_ep} | sps {sps_now:.0f} (env {env_sps:.0f})")
      if metrics_acc:
        line += " | " + " ".join(f"{k} {np.mean(v):.3g}" for k, v in metrics_acc.items())
      logger.log(now, scalars, line)
      metrics_acc = {}
      while next_log <= now:
        next_log += run.log_every
    if now >= next_ckpt:
      save(tree, wall_before + time.perf_counter() - t_start)
      while next_ckpt <= now:
        next_ckpt += run.checkpoint_every

  wall = wall_before + time.perf_counter() - t_start
  if mngr.latest_step() != env_steps_of(tree):
    save(tree, wall)
  logger.close()

  elapsed = (time.perf_counter() - t_timed) if t_timed is not None else 0.0
  first, first_ep = episodes.first_success()
  summary = dict(
      env=run.env, agent=run.agent, seed=run.seed,
      deepsea_size=run.deepsea_size if deepsea else None,
      solved=first is not None, first_success_step=first, first_success_episode=first_ep,
      success_rate_last_100=episodes.last(episodes.success),
      return_last_100=episodes.last(episodes.ret),
      episodes=episodes.count, successes=int(sum(episodes.success)),
      env_steps=env_steps_of(tree),
      sps=(steps_timed / elapsed) if elapsed > 0 and steps_timed > 0 else None,
      env_sps=env_sps, wall_s=wall, resumed_from=resumed_from,
      total_steps=run.total_steps, max_episodes=run.max_episodes, hparams=hp)
  (out_dir / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
  if run.plot:
    plot_learning_curve(out_dir / "learning_curve.png", episodes, title)
  return summary


# ------------------------------------------------------------------------------------------
# Flags.

def define_flags() -> None:
  """Defines this binary's flags (benchmarks.exploration reuses them).

  Called under ``__main__`` only, never at import: importing the module (the tests and the
  exploration grid do) must define no flag, or a second binary in the same process hits
  absl's ``DuplicateFlagError``.
  """
  flags.DEFINE_enum("env", "deepsea", ENVS, "Environment.")
  flags.DEFINE_enum("agent", "dqn", AGENTS, "Agent.")
  flags.DEFINE_integer("total_steps", 100_000, "Env steps (summed over envs) to train for.")
  flags.DEFINE_integer("max_episodes", 0, "Stop after this many episodes (0: no limit).")
  flags.DEFINE_integer("stop_after_solved_episodes", -1,
                       "Stop this many episodes after the first success (-1: never).")
  flags.DEFINE_integer("seed", 0, "Seed of the agent and the envs.")
  flags.DEFINE_string("out_dir", "/tmp/csd_rl", "Output folder (summary, plot, TensorBoard, "
                      "checkpoints); rerun with the same flags to resume.")
  flags.DEFINE_integer("deepsea_size", 10, "DeepSea size N (N x N grid, N steps per episode).")
  flags.DEFINE_integer("mapping_seed", 42, "DeepSea action mapping seed (bsuite: 42).")
  flags.DEFINE_integer("checkpoint_every", 50_000, "Env steps between checkpoints (0: at the end).")
  flags.DEFINE_string("checkpoint_dir", None, "Checkpoint folder (default OUT_DIR/checkpoints); "
                      "a rerun with the same flags resumes from it.")
  flags.DEFINE_integer("log_every", 10_000, "Env steps between progress lines / TensorBoard.")
  flags.DEFINE_bool("tensorboard", True, "Write TensorBoard scalars to OUT_DIR/tb.")
  flags.DEFINE_string("jax_cache_dir", "~/.cache/csd_jax/xla",
                      "Persistent XLA compilation cache ('' disables).")
  # hyper-parameters: None = the environment's default (DEFAULTS)
  flags.DEFINE_integer("num_envs", None, "Vectorised envs (DeepSea 4, VizDoom 8).")
  flags.DEFINE_float("gamma", None, "Discount (DeepSea 0.99, VizDoom 0.997).")
  flags.DEFINE_integer("n_step", None, "n-step returns (DeepSea 1, VizDoom 10).")
  flags.DEFINE_float("learning_rate", None, "Adam step size (DeepSea 1e-3, VizDoom 2.5e-4).")
  flags.DEFINE_float("adam_eps", None, "Adam epsilon (1.5e-4).")
  flags.DEFINE_float("max_grad_norm", None, "Global gradient-norm clip (10).")
  flags.DEFINE_integer("batch_size", None, "Batch size (DeepSea 128, VizDoom 32).")
  flags.DEFINE_integer("updates_per_step", None,
                       "Gradient updates per vectorised env step (DeepSea 1, VizDoom 2).")
  flags.DEFINE_integer("target_update_frames", None,
                       "Env steps between target syncs (DeepSea 32 / bdqn 16, VizDoom 8000).")
  flags.DEFINE_integer("learning_starts", None, "Env steps before learning (DeepSea 512, "
                       "VizDoom 10000).")
  flags.DEFINE_integer("buffer_size", None, "Replay capacity in transitions (100000).")
  flags.DEFINE_float("eps_start", None, "Initial ε (DeepSea 0.1, VizDoom 1.0; bdqn 0).")
  flags.DEFINE_float("eps_end", None, "Final ε (DeepSea 0.1, i.e. constant; VizDoom 0.01; bdqn 0).")
  flags.DEFINE_float("exploration_fraction", None, "Fraction of total_steps of the ε decay (0.1).")
  flags.DEFINE_string("q_widths", None, "DeepSea MLP hidden widths ('64,64').")
  flags.DEFINE_float("bonus_coef", None, "Intrinsic reward coefficient (DeepSea 0.3, VizDoom "
                     "0.1), applied to the bonus divided by its running std.")
  flags.DEFINE_bool("bonus_at_update", None, "Recompute the bonus of replayed next observations "
                    "at update time (DeepSea) instead of storing it at collection (VizDoom).")
  flags.DEFINE_bool("bonus_center", None, "Subtract the running mean of the bonus too, so that "
                    "familiar observations give negative intrinsic reward and untried actions "
                    "(whose Q stays near its init) look better than tried ones (DeepSea on, "
                    "VizDoom off).")
  flags.DEFINE_integer("bonus_recent", None, "Train the bonus with half of each batch drawn from "
                       "the newest this-many transitions, so novelty fades soon after a visit "
                       "(DeepSea 400; VizDoom 0 = uniform replay only).")
  flags.DEFINE_float("csd_lr", None, "csd: SGD step size of g (Nesterov momentum 0.99, after a "
                     "global-norm clip at 1; DeepSea 1.0, VizDoom 0.05; 0 = csd_jax's default "
                     "optimizer, SGD 0.5 unclipped). Stable below ~1.3 / λ_max of the label block.")
  flags.DEFINE_integer("num_heads", None, "bdqn: number of heads K (10).")
  flags.DEFINE_float("prior_scale", None, "bdqn: prior scale β (DeepSea 3, VizDoom 1).")
  flags.DEFINE_float("mask_prob", None, "bdqn: bootstrap mask probability (0.5).")
  flags.DEFINE_integer("csd_prior_width", None, "csd: hidden width of the DeepSea prior MLP "
                       "(256); VizDoom: 0 = the Nature torso's 512.")
  flags.DEFINE_float("rnd_lr", None, "rnd: predictor Adam step size (DeepSea 1e-3, VizDoom 1e-4).")
  flags.DEFINE_integer("rnd_dim", None, "rnd: output size of the RND nets (64).")
  flags.DEFINE_float("env_timeout_s", 300.0, "VizDoom: an env reset/step that takes longer is "
                     "a failure: the run checkpoints and stops with the env id (rl.envs.Watchdog).")
  flags.DEFINE_integer("chunk_steps", None, "DeepSea: vectorised steps per jitted chunk (250).")
  launch.define_flags()  # --mesh (data-parallel learner updates), multi-process flags
  flag_checks.positive("total_steps", "deepsea_size", "log_every", "num_envs", "n_step",
                       "learning_rate", "adam_eps", "max_grad_norm", "batch_size",
                       "updates_per_step", "target_update_frames", "buffer_size", "num_heads",
                       "rnd_lr", "rnd_dim", "chunk_steps", "env_timeout_s")
  flag_checks.non_negative("max_episodes", "seed", "mapping_seed", "checkpoint_every",
                           "learning_starts", "bonus_coef", "bonus_recent", "csd_lr",
                           "csd_prior_width", "prior_scale")
  flag_checks.in_unit_interval("eps_start", "eps_end", "exploration_fraction")
  flag_checks.in_unit_interval("gamma", "mask_prob", zero_allowed=False)
  flag_checks.writable_dir("out_dir")
  flag_checks.writable_dir("checkpoint_dir", optional=True)

FLAGS = flags.FLAGS


def enable_compilation_cache(path: str) -> None:
  if not path:
    return
  import jax
  jax.config.update("jax_compilation_cache_dir", os.path.expanduser(path))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)


def run_config_from_flags() -> RunConfig:
  return RunConfig(
      env=FLAGS.env, agent=FLAGS.agent, total_steps=FLAGS.total_steps,
      max_episodes=FLAGS.max_episodes, stop_after_solved_episodes=FLAGS.stop_after_solved_episodes,
      seed=FLAGS.seed, out_dir=FLAGS.out_dir, deepsea_size=FLAGS.deepsea_size,
      mapping_seed=FLAGS.mapping_seed, checkpoint_every=FLAGS.checkpoint_every,
      checkpoint_dir=FLAGS.checkpoint_dir,
      log_every=FLAGS.log_every, tensorboard=FLAGS.tensorboard, mesh=FLAGS.mesh,
      env_timeout_s=FLAGS.env_timeout_s,
      hparams={k: FLAGS[k].value for k in HPARAMS if FLAGS[k].value is not None})


def quiet_libraries() -> None:
  """orbax logs every checkpoint step at INFO through absl: keep absl at WARNING unless the
  user asked for more (--verbosity)."""
  if not FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)


def exit_on_env_failure(binary: str, fn: Callable[[], Any]) -> Any:
  """``fn()``; an ``EnvFailure`` ends the process with one line and status 1, an interrupt
  propagates. Either way this process's ViZDoom games are killed first, so none outlives it."""
  try:
    return fn()
  except envs.EnvFailure as e:
    print(f"{binary}: {e}", file=sys.stderr, flush=True)
    envs.kill_all_games()
    os._exit(1)  # not sys.exit: a hung env thread would block the interpreter's exit
  except KeyboardInterrupt:
    envs.kill_all_games()
    raise


def main(argv):
  del argv
  quiet_libraries()
  launch.setup()  # joins a multi-process run first (--distributed); --mesh is built per run
  enable_compilation_cache(FLAGS.jax_cache_dir)
  flag_checks.record(FLAGS.out_dir, "rl_main")
  summary = exit_on_env_failure("rl.main", lambda: train(run_config_from_flags()))
  print(json.dumps({k: summary[k] for k in ("solved", "first_success_step",
                                            "first_success_episode", "success_rate_last_100",
                                            "episodes", "sps", "env_sps")}))


if __name__ == "__main__":
  define_flags()
  app.run(main)
