r"""Why a DeepSea agent's episodes stop short of the treasure: its values, cell by cell, as it learns.

    python -m benchmarks.deepsea_probe --config.run.size=40 --config.episodes=4000 \
        --out_dir=docs/results/deepsea_probe/default

Trains one seed of one agent (``config.run``: a ``configs/deepsea.py`` profile, ``csd_sa`` by
default, on the tuning MDP, mapping seed 0) with ``rl.deepsea``'s jitted chunks, and every
``probe_every`` episodes reads the learner on every cell (row r, column c <= r) for both
actions, named by what they do there (right or left, through the MDP's action mapping):

- ``prior``: reward_prior · r_in(s, a), the normalised bonus that Q̂_in adds (``rl.dqn``);
- ``q_in``: Q̂_in(s, a), the intrinsic head with that prior; ``q_ext``: Q_ext(s, a);
- ``margin``: (Q_ext + β Q̂_in)(s, right) − (Q_ext + β Q̂_in)(s, left), > 0 where the greedy
  agent moves right (the state-action agents act greedily, ε = 0);
- ``visits``: how often the cell occurs among the replay's rows (the last ``buffer_size``
  transitions).

Per probe it records the greedy rollout from the start (``greedy_right_moves``, and
``greedy_leaves_diagonal``: the move on which it first goes left, N if never), the diagonal's
margin, prior, Q̂_in and visits, the lower triangle's mean prior, the mean prior of the cells
below the diagonal that the replay holds at least ``VISITED`` times (where an episode walks once
it has left the diagonal), and the episodes since the last probe (mean and most right moves). Writes ``probe.json`` and ``probe.png`` (the last probe's maps; the diagonal's
margin and the episodes' right moves over time).
"""

from __future__ import annotations

import json
import pathlib
import time

import jax
import jax.numpy as jnp
import matplotlib
import ml_collections
import numpy as np
from absl import flags

from rl import agents
from rl import deepsea
from rl import dqn
from rl import networks
from rl import records
from rl import run_config
from cmdline import cli

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the file-only backend)

FLAGS = flags.FLAGS
NAME = "deepsea_probe"
VISITED = 50  # replay rows at a cell for it to count as visited


def define_flags() -> flags.FlagHolder:
  """``--out_dir`` and ``--config`` (configs/deepsea_probe.py); under ``__main__`` only."""
  return cli.define_out_dir_and_config(NAME)


def check(config: ml_collections.ConfigDict) -> run_config.DeepSea:
  """The checked run of ``config.run``; raises ``cli.ConfigError`` naming a bad field."""
  cli.check(config, positive=["episodes", "probe_every"])
  run = run_config.from_config(run_config.DeepSea, config.run)
  if not agents.AGENTS[run.agent].state_action:
    raise cli.ConfigError(
        f"the probe reads the intrinsic head of the state-action agents "
        f"({', '.join(n for n in agents.NAMES if agents.AGENTS[n].state_action)}), "
        f"not {run.agent!r}"
    )
  return run


def action_mapping(size: int, mapping_seed: int) -> np.ndarray:
  """(N, N) int: the action that moves right at each cell (``rl.deepsea_env``'s MDP)."""
  from gymnax.environments.bsuite.deep_sea import DeepSea

  return np.asarray(
      DeepSea(size=size, action_mapping_key=jax.random.key(mapping_seed)).action_mapping
  )


def cell_observations(size: int) -> jax.Array:
  """(N², N²) float32: the one-hot observation of every cell, row-major (cell r * N + c)."""
  return jnp.eye(size * size, dtype=jnp.float32)


def read_values(cfg, learner: dqn.Learner, size: int, env_steps) -> dict[str, jax.Array]:
  """Every cell's (N, N, A) ``prior``, ``q_in``, ``q_ext`` and acting values ``act``
  (Q_ext + β Q̂_in, head 0), by action index, of the params the agent acts on."""
  q_ext, prior, q_in = dqn.acting_values(cfg, learner, networks.preprocess(cell_observations(size)))
  q_ext = q_ext[:, 0]
  act = q_ext + dqn.beta(cfg, env_steps) * q_in
  shape = (size, size, cfg.num_actions)
  return dict(
      prior=prior.reshape(shape),
      q_in=q_in.reshape(shape),
      q_ext=q_ext.reshape(shape),
      act=act.reshape(shape),
  )


def replay_visits(replay, size: int) -> np.ndarray:
  """(N, N) counts of each cell among the replay's valid rows (the one-hot's hot entry)."""
  rows = min(int(replay.count), replay.obs.shape[0])
  obs = np.asarray(replay.obs[:rows]).reshape(-1, size * size)
  valid = np.asarray(replay.valid[:rows]).reshape(-1) & (obs.sum(axis=1) > 0)
  cells = np.argmax(obs[valid], axis=1)
  return np.bincount(cells, minlength=size * size).reshape(size, size)


def right_left(values: np.ndarray, mapping: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(N, N, 2) values by action index -> (right, left) (N, N) each, by what the action does."""
  right = np.take_along_axis(values, mapping[..., None], axis=-1)[..., 0]
  left = np.take_along_axis(values, 1 - mapping[..., None], axis=-1)[..., 0]
  return right, left


def greedy_path(margin: np.ndarray) -> np.ndarray:
  """(N,) the column after each move of the greedy rollout from cell (0, 0) on the
  deterministic MDP: right where ``margin`` > 0, else left (column 0 stays at 0)."""
  size, c, columns = margin.shape[0], 0, []
  for r in range(size):
    c = c + 1 if margin[r, c] > 0 else max(c - 1, 0)
    columns.append(c)
  return np.asarray(columns)


def probe(cfg, loop, size: int, mapping: np.ndarray) -> dict:
  """The maps (N, N) and the diagonal's readings of one learner (module docstring)."""
  agent = loop.agent
  v = {
      k: np.asarray(a, np.float64)
      for k, a in read_values(cfg, agent.learner, size, agent.env_steps).items()
  }
  maps = {}
  for name in ("prior", "q_in", "q_ext", "act"):
    maps[f"{name}_right"], maps[f"{name}_left"] = right_left(v[name], mapping)
  maps["margin"] = maps["act_right"] - maps["act_left"]
  maps["visits"] = replay_visits(agent.replay, size)
  diag = np.arange(size)
  lower = np.tril(np.ones((size, size), bool))
  columns = greedy_path(maps["margin"])
  return dict(
      maps=maps,
      greedy_right_moves=int(np.sum(np.diff(columns, prepend=0) > 0)),
      greedy_leaves_diagonal=int(np.argmin(columns == np.arange(1, size + 1)))
      if columns[-1] < size
      else size,
      diagonal={
          k: maps[k][diag, diag].tolist()
          for k in ("margin", "prior_right", "prior_left", "q_in_right", "q_in_left", "visits")
      },
      triangle_prior_right=float(maps["prior_right"][lower].mean()),
      triangle_prior_left=float(maps["prior_left"][lower].mean()),
      **below_visited(maps),
  )


def below_visited(maps: dict) -> dict:
  """The prior of the cells below the diagonal that the replay holds at least ``VISITED``
  times, where an episode walks once it has left the diagonal: ``below_visited_prior``, its
  mean over both actions (NaN if there is no such cell), and ``below_visited_cells``."""
  size = maps["visits"].shape[0]
  seen = np.tril(np.ones((size, size), bool), k=-1) & (maps["visits"] >= VISITED)
  prior = np.concatenate([maps["prior_right"][seen], maps["prior_left"][seen]])
  return dict(
      below_visited_prior=float(prior.mean()) if seen.any() else float("nan"),
      below_visited_cells=int(seen.sum()),
  )


def run_probe(
    config: ml_collections.ConfigDict, out_dir: str | pathlib.Path, verbose: bool = True
) -> dict:
  """Trains ``config.run`` for ``config.episodes`` episodes, probing every ``probe_every``;
  returns (and writes) ``probe.json`` without the maps, which go to ``probe.npz`` (last probe)."""
  run = check(config)
  out = pathlib.Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  size = run.size
  cfg = deepsea.learner_config(run)
  mapping = action_mapping(size, run.mapping_seed)
  loop, env_step = deepsea.initial_loop(run, cfg)
  chunk = dqn.make_chunk(cfg, env_step, run.chunk_steps)
  episodes = records.Episodes(cfg.num_envs)
  probes, last, now, start = [], None, 0, time.perf_counter()
  next_probe = int(config.probe_every)
  while episodes.count < int(config.episodes):
    loop, rec = chunk(loop)
    rec = jax.device_get(rec)
    episodes.add_rows(now, rec["reward"], rec["done"], rec["success"], rec["valid"])
    now = int(loop.agent.env_steps)
    if episodes.count >= next_probe or episodes.count >= int(config.episodes):
      moves = deepsea.right_moves(episodes.ret, episodes.success, size)
      recent = moves[-int(config.probe_every) :]
      last = probe(cfg, loop, size, mapping)
      row = dict(
          episodes=episodes.count,
          env_steps=now,
          mean_right_moves=float(recent.mean()),
          max_right_moves=int(recent.max()),
          successes=int(np.sum(episodes.success[-int(config.probe_every) :])),
          **{k: v for k, v in last.items() if k != "maps"},
      )
      probes.append(row)
      next_probe += int(config.probe_every)
      if verbose:
        print(
            f"[probe] episode {row['episodes']}: right moves mean {row['mean_right_moves']:.1f} "
            f"max {row['max_right_moves']}, greedy rollout {row['greedy_right_moves']}, "
            f"mean prior right/left {row['triangle_prior_right']:.2f}/"
            f"{row['triangle_prior_left']:.2f}, visited below the diagonal "
            f"{row['below_visited_prior']:.2f} ({time.perf_counter() - start:.0f} s)",
            flush=True,
        )
  first = episodes.first_success()[1]
  result = dict(
      agent=run.agent,
      size=size,
      seed=run.seed,
      mapping_seed=run.mapping_seed,
      first_success_episode=first,
      probes=probes,
      seconds=time.perf_counter() - start,
      config=cli.to_dict(config),
  )
  (out / "probe.json").write_text(json.dumps(result, indent=1))
  np.savez_compressed(out / "probe.npz", **last["maps"])
  plot(result, last["maps"], out / "probe.png")
  return result


def plot(result: dict, maps: dict, path: pathlib.Path) -> None:
  """The last probe's maps over the grid, and the diagonal's margin and the episodes over time."""
  size = result["size"]
  lower = np.tril(np.ones((size, size), bool))
  panels = [
      ("visits", "replay visits (log10 1+n)", np.log10(1 + maps["visits"])),
      ("prior", "prior: right − left", maps["prior_right"] - maps["prior_left"]),
      ("q_in", "Q̂_in: right − left", maps["q_in_right"] - maps["q_in_left"]),
      ("margin", "acting margin (right − left)", maps["margin"]),
  ]
  fig, axes = plt.subplots(2, 3, figsize=(15, 9))
  for ax, (_, title, m) in zip(axes.flat[:4], panels):
    m = np.where(lower, m, np.nan)
    lim = np.nanmax(np.abs(m)) if title.startswith(("prior", "Q", "acting")) else None
    im = ax.imshow(m, cmap="coolwarm" if lim else "viridis", vmin=-lim if lim else None, vmax=lim)
    ax.set_title(f"{title}, episode {result['probes'][-1]['episodes']}")
    ax.set_xlabel("column")
    ax.set_ylabel("row")
    fig.colorbar(im, ax=ax, shrink=0.8)
  ax = axes.flat[4]
  for p in result["probes"][:: max(1, len(result["probes"]) // 6)]:
    ax.plot(p["diagonal"]["margin"], label=f"ep {p['episodes']}")
  ax.axhline(0, color="k", lw=0.5)
  ax.set_title("acting margin along the diagonal")
  ax.set_xlabel("row (= column)")
  ax.legend(fontsize=7)
  ax = axes.flat[5]
  eps = [p["episodes"] for p in result["probes"]]
  ax.plot(eps, [p["mean_right_moves"] for p in result["probes"]], label="mean right moves")
  ax.plot(eps, [p["max_right_moves"] for p in result["probes"]], label="most right moves")
  ax.plot(eps, [p["greedy_right_moves"] for p in result["probes"]], label="greedy rollout")
  ax.axhline(size, color="k", lw=0.5)
  ax.set_xlabel("episode")
  ax.set_title(f"{result['agent']} on DeepSea-{size}, seed {result['seed']}")
  ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=90)
  plt.close(fig)


def main(argv, config: ml_collections.ConfigDict):
  cli.start(argv, config, FLAGS.out_dir, NAME, check)
  run_probe(config, FLAGS.out_dir)


if __name__ == "__main__":
  config_flag = define_flags()
  cli.run(lambda argv: main(argv, config_flag.value))
