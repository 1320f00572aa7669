"""A training run's records and logging, for both RL drivers (``rl.deepsea``, ``rl.vizdoom``).

* ``Episodes``: per-episode records (end step, success, return) from vectorised step outputs.
* ``Run``: one training run's records: the stop rule, progress lines and TensorBoard scalars,
  the resumable orbax checkpoints (what must match to resume: ``rl.run_config.identity``), and
  at the end ``summary.json``, ``episodes.json`` (each episode's end step, success and return)
  and ``learning_curve.png``.
* ``SeedGroup``: the checkpoints of S seeds trained as one program (``rl.deepsea.train_seeds``):
  one orbax checkpoint of the state with its seed axis, each seed's records in its own ``Run``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

import jax
import matplotlib
import numpy as np

from csd_jax import checkpoint
from rl import run_config
from rl.event_writer import ScalarWriter

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the file-only backend)


def headline(summary: dict) -> str:
  """The summary fields a driver prints when it ends, as one JSON line."""
  return json.dumps(
      {
          k: summary[k]
          for k in (
              "solved",
              "first_success_step",
              "first_success_episode",
              "success_rate_last_100",
              "episodes",
              "sps",
              "env_sps",
          )
      }
  )


# ------------------------------------------------------------------------------------------
# Episode records.


# bsuite's DeepSea grade: learned once fewer than this fraction of the episodes so far missed.
BSUITE_BAD_FRACTION = 0.9


def bsuite_learned_episode(successes, threshold: float = BSUITE_BAD_FRACTION) -> int | None:
  """bsuite's DeepSea learning time: the first (1-based) episode e at which the fraction of
  episodes 1..e that missed the treasure falls below ``threshold`` ("#episodes until < 90% bad
  episodes", ``bsuite/experiments/deep_sea/analysis.py``, whose ``find_solution`` defaults to
  0.8); None if it never does. ``successes``: (E,) per episode, in order."""
  s = np.asarray(successes, np.float64)
  if s.ndim != 1:
    raise ValueError(f"successes must be one row per episode, got shape {s.shape}")
  if not 0.0 < threshold <= 1.0:
    raise ValueError(f"threshold must be in (0, 1], got {threshold}")
  e = np.arange(1, s.size + 1)
  below = np.flatnonzero((e - np.cumsum(s)) / e < threshold)
  return int(below[0]) + 1 if below.size else None


class Episodes:
  """Per-episode records from vectorised step outputs."""

  def __init__(self, num_envs: int):
    self.running = np.zeros(num_envs, np.float64)
    self.end_step: list[int] = []  # env steps at the episode's last step
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
    return dict(
        running=self.running.tolist(),
        end_step=self.end_step,
        success=[int(s) for s in self.success],
        ret=self.ret,
    )

  def load(self, d: dict) -> None:
    self.running = np.asarray(d["running"], np.float64)
    self.end_step = [int(s) for s in d["end_step"]]
    self.success = [bool(s) for s in d["success"]]
    self.ret = [float(r) for r in d["ret"]]


# ------------------------------------------------------------------------------------------
# A run's records.


def latest_identity(manager) -> dict | None:
  """The config saved with ``manager``'s newest checkpoint; None when there is none or it
  cannot be read (``checkpoint.restore_latest`` then sets it aside and tries an older one)."""
  import orbax.checkpoint as ocp

  step = manager.latest_step()
  if step is None:
    return None
  try:
    meta = manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
    return meta["meta"]["identity"]
  except Exception:  # noqa: BLE001  (orbax raises many kinds)
    return None


class Run:
  """Records of one training run in ``out_dir`` (module docstring).

  The driver calls ``restore`` once, then per batch of env steps ``episodes.add_rows``,
  ``add_metrics`` and ``after_steps`` while not ``should_stop``, and ``finish`` at the end.
  Checkpointed trees hold ``env_steps`` at ``tree_steps(tree)``.
  """

  def __init__(
      self,
      config: run_config.RunConfig,
      out_dir: str | os.PathLike,
      *,
      num_envs: int,
      label: str,
      epsilon: Callable[[int], float] = lambda env_steps: 0.0,
      checkpoint_dir: str | None = None,
      tensorboard: bool = True,
      verbose: bool = True,
      checkpoints: bool = True,
  ):
    """``label`` starts each progress line; ``epsilon(env_steps)``: the agent's ε, logged.
    ``checkpoints`` False: the run saves none (a ``SeedGroup`` checkpoints its seeds)."""
    self.config, self.label, self.verbose = config, label, verbose
    self.epsilon = epsilon
    self.out_dir = Path(out_dir)
    self.out_dir.mkdir(parents=True, exist_ok=True)
    self.identity = run_config.identity(config)
    self.episodes = Episodes(num_envs)
    # TensorFlow-free scalars (rl.event_writer says why)
    self.writer = ScalarWriter(self.out_dir / "tb") if tensorboard else None
    self.manager = (
        checkpoint.manager(Path(checkpoint_dir) if checkpoint_dir else self.out_dir / "checkpoints")
        if checkpoints
        else None
    )
    self.resumed_from: int | None = None
    self.t_stop: float | None = None
    self.wall_before = 0.0
    self.metrics: dict[str, list] = {}

  # --- checkpoints

  def restore(self, tree: Any) -> Any | None:
    """The newest checkpoint's tree (``tree``: one of the same structure), with the episode
    records restored; None when there is none. A checkpoint of another config is a
    ``cli.ConfigError`` naming the fields that differ, found from its config before its arrays
    are read (another config may mean other shapes, e.g. ``pixels.actions``)."""
    self._check_identity(self._latest_identity())
    restored = checkpoint.restore_latest(self.manager, jax.tree.map(lambda x: x, tree))
    if restored is None:
      return None
    tree, meta = restored
    self._check_identity(meta["identity"])
    self.episodes.load(meta["episodes"])
    self.resumed_from = int(meta["env_steps"])
    self.wall_before = float(meta.get("wall_s", 0.0))
    if self.verbose:
      print(
          f"resumed from {self.manager.directory} at env step {self.resumed_from} "
          f"({self.episodes.count} episodes)",
          file=sys.stderr,
          flush=True,
      )
    return tree

  def _latest_identity(self) -> dict | None:
    return latest_identity(self.manager)

  def _check_identity(self, saved: dict | None) -> None:
    run_config.check_identity(
        saved,
        self.identity,
        f"{self.out_dir}: the checkpoint was written with a " "different config",
        "use another --out_dir or the same config",
    )

  def save(self, tree: Any, env_steps: int) -> None:
    meta = dict(
        identity=self.identity,
        env_steps=env_steps,
        episodes=self.episodes.state(),
        wall_s=self.wall(),
    )
    checkpoint.save(self.manager, env_steps, tree, meta)

  # --- the loop

  def start(self, env_steps: int) -> None:
    """Starts the clocks at ``env_steps`` (0, or where a resumed run stands)."""
    self.t_start = time.perf_counter()
    self.t_timed, self.steps_timed = (
        None,
        0,
    )  # the SPS clock starts after the first (compiling) call
    self.next_log = env_steps + self.config.log_every
    self.next_ckpt = env_steps + (self.config.checkpoint_every or float("inf"))
    self.last_log_t, self.last_log_steps = time.perf_counter(), env_steps

  def wall(self) -> float:
    return self.wall_before + (self.t_stop or time.perf_counter()) - self.t_start

  def stop_clock(self) -> None:
    """Stops the wall and SPS clocks where the run stopped (a seed of a ``SeedGroup`` that
    stops before the others: its summary is written at the group's end)."""
    if self.t_stop is None:
      self.t_stop = time.perf_counter()

  def should_stop(self, env_steps: int) -> bool:
    """``total_steps`` reached, ``max_episodes`` reached, ``stop_after_solved_episodes``
    episodes since the first success, or (``stop_when_learned``) bsuite's learning time."""
    c = self.config
    if env_steps >= c.total_steps:
      return True
    if c.max_episodes and self.episodes.count >= c.max_episodes:
      return True
    if c.stop_after_solved_episodes >= 0:
      _, first_ep = self.episodes.first_success()
      if first_ep is not None and self.episodes.count >= first_ep + c.stop_after_solved_episodes:
        return True
    if c.stop_when_learned and bsuite_learned_episode(self.episodes.success) is not None:
      return True
    return False

  def log_due(self, env_steps: int) -> bool:
    return env_steps >= self.next_log

  def add_metrics(self, metrics: dict[str, float]) -> None:
    """Learner metrics (means over updates) to average into the next progress line."""
    for k, v in metrics.items():
      self.metrics.setdefault(k, []).append(float(v))

  def restart_timing(self) -> None:
    """Restarts the SPS clock at the next ``after_steps`` (call it on a step that compiled, e.g.
    the first update: ``sps`` then times learning only)."""
    self.t_timed, self.steps_timed = None, 0

  def after_steps(self, before: int, now: int, tree: Any, *, env_sps: float) -> None:
    """After env steps ``before`` -> ``now``: times them, logs when due (or at the stop) and
    checkpoints ``tree`` when due."""
    if self.t_timed is None:
      self.t_timed = self.last_log_t = time.perf_counter()
      self.last_log_steps = now
    else:
      self.steps_timed += now - before
    if self.log_due(now) or self.should_stop(now):
      self._log(now, env_sps)
      while self.next_log <= now:
        self.next_log += self.config.log_every
    if now >= self.next_ckpt:
      if self.manager is not None:
        self.save(tree, now)
      while self.next_ckpt <= now:
        self.next_ckpt += self.config.checkpoint_every

  def _log(self, now: int, env_sps: float) -> None:
    t = time.perf_counter()
    sps_now = (now - self.last_log_steps) / max(t - self.last_log_t, 1e-9)
    self.last_log_t, self.last_log_steps = t, now
    ep = self.episodes
    _, first_ep = ep.first_success()
    sr, ret = ep.last(ep.success), ep.last(ep.ret)
    means = {k: float(np.mean(v)) for k, v in self.metrics.items()}
    if self.writer is not None:
      scalars = {
          "charts/episodes": ep.count,
          "charts/success_rate_100": sr,
          "charts/return_100": ret,
          "charts/sps": sps_now,
          "charts/env_sps": env_sps,
          "charts/epsilon": self.epsilon(now),
          **{f"losses/{k}": v for k, v in means.items()},
      }
      for k, v in scalars.items():
        if v is not None and np.isfinite(v):
          self.writer.add_scalar(k, float(v), now)
      self.writer.flush()
    if self.verbose:
      line = (
          f"[{self.label}] step {now}/{self.config.total_steps} | episodes {ep.count} | "
          f"success_100 {sr if sr is not None else float('nan'):.2f} | "
          f"first_success {first_ep} | sps {sps_now:.0f} (env {env_sps:.0f})"
      )
      if means:
        line += " | " + " ".join(f"{k} {v:.3g}" for k, v in means.items())
      print(line, file=sys.stderr, flush=True)
    self.metrics = {}

  # --- the end

  def finish(self, tree: Any, env_steps: int, *, env_sps: float, title: str, **fields) -> dict:
    """Checkpoints the final ``tree`` (unless just saved), writes ``summary.json`` (``fields``
    first: env, agent, ...) and the learning curve; returns the summary."""
    if self.manager is not None and self.manager.latest_step() != env_steps:
      self.save(tree, env_steps)
    wall = self.wall()
    if self.writer is not None:
      self.writer.close()
    end = self.t_stop or time.perf_counter()
    elapsed = (end - self.t_timed) if self.t_timed is not None else 0.0
    ep = self.episodes
    first, first_ep = ep.first_success()
    summary = dict(
        **fields,
        solved=first is not None,
        first_success_step=first,
        first_success_episode=first_ep,
        success_rate_last_100=ep.last(ep.success),
        return_last_100=ep.last(ep.ret),
        episodes=ep.count,
        successes=int(sum(ep.success)),
        env_steps=env_steps,
        sps=(self.steps_timed / elapsed) if elapsed > 0 and self.steps_timed > 0 else None,
        env_sps=env_sps,
        wall_s=wall,
        resumed_from=self.resumed_from,
        config=run_config.to_dict(self.config),
    )
    (self.out_dir / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    (self.out_dir / "episodes.json").write_text(
        json.dumps({k: v for k, v in ep.state().items() if k != "running"})
    )
    if self.config.plot:
      plot_learning_curve(self.out_dir / "learning_curve.png", ep, title)
    return summary

  def close(self) -> None:
    """Closes the TensorBoard writer (``finish`` does; for a run that ends by an error)."""
    if self.writer is not None:
      self.writer.close()
      self.writer = None


class SeedGroup:
  """The checkpoints of S seeds trained as one program (``rl.deepsea.train_seeds``): one orbax
  checkpoint of the whole state, seed axis included, whose meta holds each seed's env steps and
  episode records; its identity is the config's (``rl.run_config.identity``) with the seed list. Each seed
  keeps its own ``Run`` (``checkpoints=False``) for its progress lines, TensorBoard scalars and
  end-of-run files, written as a one-seed run writes them.
  """

  def __init__(
      self,
      config: run_config.RunConfig,
      seeds: list[int],
      runs: list[Run],
      checkpoint_dir: str | os.PathLike,
      verbose: bool = True,
  ):
    self.config, self.runs, self.verbose = config, runs, verbose
    self.identity = dict(run_config.identity(config), seeds=[int(s) for s in seeds])
    self.manager = checkpoint.manager(Path(checkpoint_dir))
    self.next_ckpt = float("inf")

  def restore(self, tree: Any) -> Any | None:
    """The newest checkpoint's tree (``tree``: one of the same structure, shardings kept), each
    seed's records restored into its ``Run``; None when there is none. A checkpoint of another
    config or seed list is a ``cli.ConfigError`` naming the fields that differ."""
    self._check_identity(latest_identity(self.manager))  # before its arrays: other shapes
    restored = checkpoint.restore_latest(self.manager, jax.tree.map(lambda x: x, tree))
    if restored is None:
      return None
    tree, meta = restored
    self._check_identity(meta["identity"])
    for run, episodes, steps in zip(self.runs, meta["episodes"], meta["env_steps"]):
      run.episodes.load(episodes)
      run.resumed_from = int(steps)
      run.wall_before = float(meta.get("wall_s", 0.0))
    if self.verbose:
      print(
          f"resumed from {self.manager.directory} at env steps {meta['env_steps']}",
          file=sys.stderr,
          flush=True,
      )
    return tree

  def _check_identity(self, saved: dict | None) -> None:
    run_config.check_identity(
        saved,
        self.identity,
        f"{self.manager.directory}: the checkpoint was written "
        "with a different config or seed list",
        "use another folder or the same config",
    )

  def start(self, env_steps: list[int]) -> None:
    for run, now in zip(self.runs, env_steps):
      run.start(now)
    self.next_ckpt = max(env_steps) + (self.config.checkpoint_every or float("inf"))

  def save(self, tree: Any, env_steps: list[int]) -> None:
    """Checkpoint number ``sum(env_steps)`` (it grows while any seed runs) of ``tree``."""
    meta = dict(
        identity=self.identity,
        env_steps=[int(s) for s in env_steps],
        episodes=[run.episodes.state() for run in self.runs],
        wall_s=max(run.wall() for run in self.runs),
    )
    checkpoint.save(self.manager, int(sum(env_steps)), tree, meta)

  def maybe_save(self, tree: Any, env_steps: list[int]) -> None:
    """Saves every ``checkpoint_every`` env steps of the furthest seed."""
    if max(env_steps) >= self.next_ckpt:
      self.save(tree, env_steps)
      while self.next_ckpt <= max(env_steps):
        self.next_ckpt += self.config.checkpoint_every

  def finish(self, tree: Any, env_steps: list[int]) -> None:
    """The final checkpoint (unless just saved)."""
    if self.manager.latest_step() != sum(env_steps):
      self.save(tree, env_steps)


def last_n_means(values, n: int = 100) -> np.ndarray:
  """Means over the last ``n`` values, at each value from the ``n``-th on (one mean of all of
  them when fewer): (max(len - n, 0) + 1,) for a non-empty sequence."""
  v = np.asarray(values, np.float64)
  w = min(n, len(v))
  return np.convolve(v, np.ones(w) / w, "valid")


def plot_learning_curve(path: Path, episodes: Episodes, title: str) -> None:
  """Success rate and extrinsic return over the last 100 episodes vs env steps."""
  fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
  if episodes.count:
    x = np.asarray(episodes.end_step)
    w = min(100, len(x))
    ax1.plot(x[w - 1 :], last_n_means(episodes.success))
    ax2.plot(x[w - 1 :], last_n_means(episodes.ret))
    first, _ = episodes.first_success()
    if first is not None:
      for ax in (ax1, ax2):
        ax.axvline(first, color="k", ls=":", lw=1, label="first success")
      ax1.legend(loc="upper left")
  ax1.set_ylabel("success rate\n(last 100 episodes)")
  ax2.set_ylabel("extrinsic return\n(last 100 episodes)")
  ax2.set_xlabel("environment steps")
  ax1.set_title(title)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
