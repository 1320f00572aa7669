r"""What decides a VizDoom state-action agent's greedy action: Q_ext or β Q̂_in, read from a
run's newest checkpoint.

    python -m benchmarks.doom_probe \
        --run_dirs=out/doom5/sparse/doom_sparse/csd_sa/seed1 --out_dir=out/doom_probe

For each run folder (one ``rl.vizdoom`` run: its ``summary.json`` holds the config; its
checkpoints are under ``checkpoints/``; read only) it restores the learner and reads the newest
``--states`` observations of its replay (the states its current policy visits), and reports:

- ``ext_gap`` / ``in_gap``: Q_ext's and Q̂_in's max minus median over actions (quantiles over
  states), Q̂_in = Q_in + the reward prior (``rl.dqn.acting_values``); an agent without an
  intrinsic head (DQN, BDQN: ``ext_gap`` of its first head) reports ``ext_gap`` alone;
- ``int_q_mean``: Q̂_in's mean;
- ``flips``: for β at the checkpoint's step (``rl.dqn.beta``) times each of ``--beta_scales``,
  the fraction of states where argmax(Q_ext + β Q̂_in) differs from argmax Q_ext, i.e. where
  the bonus, not the task's value, picks the greedy action.

Writes OUT_DIR/doom_probe.json (one report per run folder) and prints one line per run.
"""

from __future__ import annotations

import functools
import json
import pathlib
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags

from cmdline import cli
from cmdline import flag_checks
from csd_jax import checkpoint
from rl import dqn
from rl import networks
from rl import run_config
from rl import vizdoom

FLAGS = flags.FLAGS


def define_flags() -> None:
  """The probe's flags; under ``__main__`` only."""
  flags.DEFINE_list("run_dirs", None, "rl.vizdoom run folders (with summary.json).", required=True)
  flags.DEFINE_integer("states", 2048, "How many of the newest replayed states to read.")
  flags.DEFINE_list("beta_scales", ["0.1", "0.3", "1", "3"], "Multiples of the run's β.")
  flags.DEFINE_string("out_dir", "out/doom_probe", "Where doom_probe.json goes.")
  flag_checks.writable_dir("out_dir")
  flag_checks.positive("states")


def restore(run_dir: pathlib.Path) -> tuple[dqn.dqn_config.Config, dqn.AgentState, int]:
  """The learner config (from ``summary.json``), the agent state of the newest checkpoint and
  its env step. Read only: the run's checkpoints stay as they are."""
  summary_path = run_dir / "summary.json"
  if not summary_path.exists():
    raise cli.ConfigError(f"{summary_path} not found: the probe reads finished or stopped runs")
  config = run_config.from_config(
      run_config.VizDoom, json.loads(summary_path.read_text())["config"]
  )
  cfg = vizdoom.learner_config(config)
  obs = jnp.zeros((cfg.num_envs, *vizdoom.pixels(config).obs_shape), jnp.uint8)
  template = dqn.init(cfg, jax.random.PRNGKey(0), obs)
  restored = checkpoint.read_latest(run_dir / "checkpoints", {"agent": template})
  if restored is None:
    raise cli.ConfigError(f"no checkpoint under {run_dir / 'checkpoints'}")
  tree, meta = restored
  return cfg, tree["agent"], int(meta["env_steps"])


def newest_states(replay, n: int) -> jax.Array:
  """The newest ``n`` rows' observations over all envs: (n * E, *obs_shape)."""
  cap = replay.obs.shape[0]
  count = int(replay.count)
  if count == 0:
    raise cli.ConfigError("the replay is empty: nothing to probe")
  rows = jnp.arange(count - min(n, count, cap), count) % cap
  obs = replay.obs[rows]  # (n, E, *obs_shape): only those rows leave the replay
  return obs.reshape((-1, *obs.shape[2:]))


@functools.lru_cache(maxsize=8)
def acting_values(cfg) -> Callable:
  """``rl.dqn.acting_values`` of ``cfg``, jitted once per config."""
  return jax.jit(functools.partial(dqn.acting_values, cfg))


def gap(q: np.ndarray) -> np.ndarray:
  """Max minus median over the last (action) axis."""
  return q.max(-1) - np.median(q, -1)


def flip_fractions(q: np.ndarray, q_in: np.ndarray, beta: float, scales: list[float]) -> dict:
  """Per scale s, the fraction of states (rows of ``q``, ``q_in``: (S, A)) whose argmax of
  q + s·β·q_in is not argmax q."""
  greedy = q.argmax(-1)
  return {s: float(((q + s * beta * q_in).argmax(-1) != greedy).mean()) for s in scales}


def read(cfg, agent: dqn.AgentState, env_steps: int, states: int, scales: list[float]) -> dict:
  """The report of one learner (module docstring) on its newest ``states`` replayed states."""
  x = networks.preprocess(newest_states(agent.replay, max(1, states // cfg.num_envs)))
  q, _, q_in = acting_values(cfg)(agent.learner, x)
  q = np.asarray(q[:, 0])
  quantiles = lambda v: {p: float(np.quantile(v, p / 100)) for p in (10, 50, 90)}
  report = dict(env_steps=env_steps, states=int(q.shape[0]), ext_gap=quantiles(gap(q)))
  if q_in is None:  # no intrinsic head: Q_ext alone picks the greedy action
    return report
  q_in = np.asarray(q_in)
  beta = float(dqn.beta(cfg, jnp.asarray(env_steps)))
  return dict(
      report,
      beta=beta,
      in_gap=quantiles(gap(q_in)),
      int_q_mean=float(q_in.mean()),
      flips=flip_fractions(q, q_in, beta, scales),
  )


def probe(run_dir: pathlib.Path, states: int, scales: list[float]) -> dict:
  """``read`` of the run in ``run_dir``'s newest checkpoint."""
  return dict(run_dir=str(run_dir), **read(*restore(run_dir), states, scales))


def main(argv):
  del argv
  scales = [float(s) for s in FLAGS.beta_scales]
  report = [probe(pathlib.Path(d), FLAGS.states, scales) for d in FLAGS.run_dirs]
  for r in report:
    line = f"{r['run_dir']} @ {r['env_steps']}: Q_ext gap p50 {r['ext_gap'][50]:.3g}"
    if "flips" in r:
      line += (
          f", β {r['beta']:.2e}, Q̂_in gap p50 {r['in_gap'][50]:.3g}, Q̂_in mean "
          f"{r['int_q_mean']:.3g}, greedy flips "
          + ", ".join(f"{s}β {f:.0%}" for s, f in r["flips"].items())
      )
    print(line)
  out = pathlib.Path(FLAGS.out_dir) / "doom_probe.json"
  out.write_text(json.dumps(report, indent=1))
  print(f"wrote {out}")


if __name__ == "__main__":
  define_flags()
  cli.run(main)
