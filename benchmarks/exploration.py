r"""The exploration grid: agents x DeepSea sizes x seeds (or agents x seeds on VizDoom).

    python -m benchmarks.exploration --config.sizes=10,20,30 --config.seeds=5 \
        --out_dir=out/exploration
    python -m benchmarks.exploration --config=configs/exploration.py:vizdoom \
        --config.variant=very_sparse --config.seeds=3 --config.total_steps=2000000 \
        --out_dir=out/doom      # a GPU machine

The config is ``configs/exploration.py``. Every cell is one ``rl.deepsea.train`` (VizDoom:
``rl.vizdoom.train``) run in ``OUT_DIR/<env>/<agent>/size<N>/seed<s>/`` (VizDoom:
``OUT_DIR/doom_<variant>/<agent>/seed<s>/``), in this process so that the compiled training loop
is reused across seeds. The grid is resumable per cell: a cell whose ``summary.json`` holds the
same config is skipped, an interrupted one resumes from its checkpoint.

Writes ``OUT_DIR/exploration.json``: ``solved_fraction[agent][size]``,
``median_episodes_to_first_success[agent][size]`` (over the seeds that solved),
``sps[agent][size]`` (mean agent env steps/s), ``env_sps`` (raw env steps/s),
``sps_ratio_to_dqn``, the per-cell summaries and the config; and ``OUT_DIR/exploration.png``
(solved fraction vs size per agent; VizDoom: per agent).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import matplotlib
import ml_collections
import numpy as np
from absl import flags

from rl import bookkeeping
from rl import deepsea
from rl import vizdoom
from uncertainty_kit import cli

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the file-only backend)

FLAGS = flags.FLAGS


def check(config: cli.ConfigDict) -> None:
  """Raises ``cli.ConfigError`` naming the first bad field (each cell is checked by its driver
  before it runs)."""
  agents = deepsea.PARTS if config.env == "deepsea" else vizdoom.PARTS
  cli.check(config, positive=["seeds", "total_steps", "log_every"],
            non_negative=["first_seed", "max_episodes", "checkpoint_every"],
            subset_of={"agents": [a for a in agents if a in config.runs]})
  if config.env == "deepsea":
    sizes = cli.split_list(config.sizes)
    if not sizes or not all(s.isdigit() and int(s) > 0 for s in sizes):
      raise cli.ConfigError(f"--config.sizes must be a comma-separated list of positive "
                            f"integers, got {config.sizes!r}")


def sizes_of(config: cli.ConfigDict) -> list[int | None]:
  """DeepSea's sizes; [None] on VizDoom (no size level)."""
  return [int(s) for s in cli.split_list(config.sizes)] if config.env == "deepsea" else [None]


def cell_config(config: cli.ConfigDict, agent: str, size: int | None, seed: int
                ) -> ml_collections.ConfigDict:
  """The config of one cell: ``config.runs[agent]`` plus the fields the grid sets."""
  cell = ml_collections.ConfigDict(config.runs[agent].to_dict())
  cell.seed = seed
  cell.total_steps = config.total_steps
  for field in ("max_episodes", "stop_after_solved_episodes", "checkpoint_every", "log_every",
                "plot"):
    cell[field] = config[field]
  if size is not None:  # DeepSea: enough steps for max_episodes episodes of size + 1 steps
    cell.size = size
    e = cell.dqn.num_envs
    need = (config.max_episodes * (size + 1) // e + 2) * e if config.max_episodes else 0
    cell.total_steps = max(config.total_steps, need)
  else:
    cell.variant = config.variant
    cell.env_timeout_s = config.env_timeout_s
  return cell


def cell_dir(out_dir: Path, env: str, agent: str, size: int | None, seed: int) -> Path:
  d = out_dir / env / agent
  if size is not None:
    d = d / f"size{size}"
  return d / f"seed{seed}"


def run_grid(config: cli.ConfigDict, out_dir: str | Path, *, checkpoint_dir: str | None = None,
             tensorboard: bool = True, mesh: str = "", verbose: bool = True) -> dict:
  """Runs (or skips finished) cells; returns and writes the aggregate."""
  check(config)
  out_dir = Path(out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  driver = deepsea if config.env == "deepsea" else vizdoom
  env_name = "deepsea" if config.env == "deepsea" else f"doom_{config.variant}"
  agents, sizes = cli.split_list(config.agents), sizes_of(config)
  seeds = list(range(config.first_seed, config.first_seed + config.seeds))
  cells: dict[str, dict[str, list]] = {}
  t_grid = time.perf_counter()
  for size in sizes:
    for agent in agents:
      for seed in seeds:
        cell = cell_config(config, agent, size, seed)
        cell_out = cell_dir(out_dir, env_name, agent, size, seed)
        # one checkpoint folder per cell, mirroring the cell folders
        cell_ckpt = (str(Path(checkpoint_dir) / cell_out.relative_to(out_dir))
                     if checkpoint_dir else None)
        summary_path = cell_out / "summary.json"
        summary = None
        if summary_path.exists():
          old = json.loads(summary_path.read_text())
          if old.get("config") == cli.to_dict(cell):
            summary = old
            print(f"[grid] {agent} size {size} seed {seed}: done, skipped", file=sys.stderr)
        if summary is None:
          t = time.perf_counter()
          summary = driver.train(cell, str(cell_out), checkpoint_dir=cell_ckpt,
                                 tensorboard=tensorboard, mesh=mesh, verbose=verbose)
          print(f"[grid] {agent} size {size} seed {seed}: solved {summary['solved']} "
                f"first_success_episode {summary['first_success_episode']} "
                f"episodes {summary['episodes']} sps {summary['sps'] or 0:.0f} "
                f"({time.perf_counter() - t:.0f} s)", file=sys.stderr, flush=True)
        cells.setdefault(agent, {}).setdefault(str(size), []).append(summary)
  result = aggregate(cells, config, env_name, agents, sizes, seeds)
  result["grid_wall_s_this_invocation"] = time.perf_counter() - t_grid
  (out_dir / "exploration.json").write_text(json.dumps(result, indent=1, default=str))
  plot(out_dir / "exploration.png", result, env_name, agents, sizes)
  return result


def aggregate(cells: dict, config: cli.ConfigDict, env_name: str, agents: list[str],
              sizes: list, seeds: list[int]) -> dict:
  solved, median, sps, env_sps, wall = {}, {}, {}, {}, {}
  for agent in agents:
    for size in sizes:
      runs = cells[agent][str(size)]
      firsts = [r["first_success_episode"] for r in runs if r["solved"]]
      solved.setdefault(agent, {})[str(size)] = len(firsts) / len(runs)
      median.setdefault(agent, {})[str(size)] = float(np.median(firsts)) if firsts else None
      s = [r["sps"] for r in runs if r.get("sps")]
      sps.setdefault(agent, {})[str(size)] = float(np.mean(s)) if s else None
      env_sps.setdefault(agent, {})[str(size)] = float(np.mean([r["env_sps"] for r in runs]))
      wall.setdefault(agent, {})[str(size)] = float(np.sum([r["wall_s"] for r in runs]))
  ratio = {a: {k: (v / sps["dqn"][k] if v and sps.get("dqn", {}).get(k) else None)
               for k, v in sps[a].items()} for a in agents} if "dqn" in agents else {}
  return dict(env=env_name, agents=agents, sizes=sizes, seeds=seeds,
              solved_fraction=solved, median_episodes_to_first_success=median,
              sps=sps, env_sps=env_sps, sps_ratio_to_dqn=ratio, wall_s_per_cell_sum=wall,
              config=cli.to_dict(config), cells=cells)


def plot(path: Path, result: dict, env_name: str, agents: list[str], sizes: list) -> None:
  """Fraction of seeds solved: vs size per agent (DeepSea), per agent (VizDoom)."""
  fig, ax = plt.subplots(figsize=(6, 4))
  if env_name == "deepsea":
    for agent in agents:
      ax.plot(sizes, [result["solved_fraction"][agent][str(s)] for s in sizes], "o-",
              label=agent)
    ax.set_xlabel("DeepSea size N")
    ax.set_xticks(sizes)
    ax.legend()
  else:
    ax.bar(agents, [result["solved_fraction"][a]["None"] for a in agents])
  ax.set_ylabel("fraction of seeds solved")
  ax.set_ylim(-0.05, 1.05)
  ax.set_title(f"{env_name}: goal reached within {result['config']['max_episodes'] or 'the'} "
               f"episodes ({len(result['seeds'])} seeds)")
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


def define_flags() -> None:
  """``--config`` (configs/exploration.py) and where the grid writes; called under
  ``__main__`` only, never at import (tests/test_binaries.py says why)."""
  cli.define_config("exploration")
  bookkeeping.define_flags("out/exploration")


def main(argv):
  del argv
  bookkeeping.setup()
  config = FLAGS.config
  check(config)
  cli.record(FLAGS.out_dir, "exploration", config)
  def grid():
    return run_grid(config, FLAGS.out_dir, checkpoint_dir=FLAGS.checkpoint_dir,
                    tensorboard=FLAGS.tensorboard, mesh=FLAGS.mesh)

  if config.env == "vizdoom":  # a hung VizDoom env ends the grid, its games killed
    result = vizdoom.exit_on_env_failure("benchmarks.exploration", grid)
  else:
    result = grid()
  print(json.dumps({k: result[k] for k in ("solved_fraction", "median_episodes_to_first_success",
                                           "sps", "env_sps", "sps_ratio_to_dqn")}, indent=1))


if __name__ == "__main__":
  define_flags()
  cli.run(main)
