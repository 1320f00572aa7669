r"""The exploration grid: agents x DeepSea sizes x seeds (or agents x seeds on VizDoom).

    python -m benchmarks.exploration --env=deepsea --sizes=10,20,30 --agents=dqn,csd,rnd,bdqn \
        --seeds=5 --out_dir=out/exploration
    python -m benchmarks.exploration --env=doom_very_sparse --agents=dqn,csd,rnd,bdqn --seeds=3 \
        --total_steps=2000000 --out_dir=out/doom      # a GPU machine

Every cell is one ``rl.main.train`` run in ``OUT_DIR/<env>/<agent>/size<N>/seed<s>/`` (VizDoom:
no size level), run in this process so that the compiled training loop is reused across seeds.
The grid is resumable per cell: a cell whose ``summary.json`` exists with the same settings is
skipped, an interrupted one resumes from its checkpoint. All of ``rl.main``'s flags apply
(hyper-parameters, ``--total_steps``, ``--max_episodes``, ...); its ``--agent``, ``--seed`` and
``--deepsea_size`` are replaced by the grid. Defaults here: ``--max_episodes=3000`` and
``--stop_after_solved_episodes=100`` (a run stops 100 episodes after its first success: the
grid measures whether and when the goal is first reached), and on DeepSea ``--total_steps`` is
raised to cover ``max_episodes`` episodes of N + 1 steps (N moves and envpool-style auto-reset).

Writes ``OUT_DIR/exploration.json``: ``solved_fraction[agent][size]``,
``median_episodes_to_first_success[agent][size]`` (over the seeds that solved),
``sps[agent][size]`` (mean agent env steps/s), ``env_sps`` (raw env steps/s),
``sps_ratio_to_dqn``, the per-cell summaries and the settings; and ``OUT_DIR/exploration.png``
(solved fraction vs size per agent; VizDoom: per agent).
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

import numpy as np
from absl import app
from absl import flags

from uncertainty_kit import flag_checks
from rl import main as rl_main

FLAGS = flags.FLAGS


def define_flags() -> None:
  """rl.main's flags plus the grid's own; called under ``__main__`` only (see rl.main)."""
  rl_main.define_flags()
  flags.DEFINE_list("sizes", ["10", "20"], "DeepSea sizes (ignored for VizDoom).")
  flags.DEFINE_list("agents", ["dqn", "csd", "rnd", "bdqn"], "Agents.")
  flags.DEFINE_integer("seeds", 5, "Seeds 0 .. seeds-1 per cell.")
  flags.DEFINE_integer("first_seed", 0, "First seed.")
  flag_checks.positive_ints("sizes")
  flag_checks.one_of_each("agents", rl_main.AGENTS)
  flag_checks.positive("seeds")
  flag_checks.non_negative("first_seed")


def cell_dir(out_dir: Path, env: str, agent: str, size: int | None, seed: int) -> Path:
  d = out_dir / env / agent
  if size is not None:
    d = d / f"size{size}"
  return d / f"seed{seed}"


def run_grid(base: rl_main.RunConfig, agents: list[str], sizes: list[int | None],
             seeds: list[int], out_dir: Path) -> dict:
  """Runs (or skips finished) cells; returns and writes the aggregate."""
  out_dir.mkdir(parents=True, exist_ok=True)
  cells: dict[str, dict[str, list]] = {}
  t_grid = time.perf_counter()
  for size in sizes:
    for agent in agents:
      for seed in seeds:
        run = dataclasses.replace(base, agent=agent, seed=seed,
                                  deepsea_size=size if size is not None else base.deepsea_size,
                                  out_dir=str(cell_dir(out_dir, base.env, agent, size, seed)))
        if base.checkpoint_dir:  # one checkpoint folder per cell, mirroring the cell folders
          run = dataclasses.replace(run, checkpoint_dir=str(
              Path(base.checkpoint_dir) / Path(run.out_dir).relative_to(out_dir)))
        if size is not None:  # DeepSea: enough steps for max_episodes episodes of size + 1 steps
          e = int(run.resolved()["num_envs"])
          need = (run.max_episodes * (size + 1) // e + 2) * e if run.max_episodes else 0
          run = dataclasses.replace(run, total_steps=max(run.total_steps, need))
        summary_path = Path(run.out_dir) / "summary.json"
        summary = None
        if summary_path.exists():
          old = json.loads(summary_path.read_text())
          if (old.get("total_steps") == run.total_steps
              and old.get("max_episodes") == run.max_episodes
              and old.get("hparams") == json.loads(json.dumps(run.resolved(), default=str))):
            summary = old
            print(f"[grid] {agent} size {size} seed {seed}: done, skipped", file=sys.stderr)
        if summary is None:
          t = time.perf_counter()
          summary = rl_main.train(run)
          print(f"[grid] {agent} size {size} seed {seed}: solved {summary['solved']} "
                f"first_success_episode {summary['first_success_episode']} "
                f"episodes {summary['episodes']} sps {summary['sps'] or 0:.0f} "
                f"({time.perf_counter() - t:.0f} s)", file=sys.stderr, flush=True)
        cells.setdefault(agent, {}).setdefault(str(size), []).append(summary)
  result = aggregate(cells, base, agents, sizes, seeds)
  result["grid_wall_s_this_invocation"] = time.perf_counter() - t_grid
  (out_dir / "exploration.json").write_text(json.dumps(result, indent=1, default=str))
  plot(out_dir / "exploration.png", result, base.env, agents, sizes)
  return result


def aggregate(cells: dict, base: rl_main.RunConfig, agents: list[str], sizes: list,
              seeds: list[int]) -> dict:
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
  return dict(env=base.env, agents=agents, sizes=sizes, seeds=seeds,
              solved_fraction=solved, median_episodes_to_first_success=median,
              sps=sps, env_sps=env_sps, sps_ratio_to_dqn=ratio, wall_s_per_cell_sum=wall,
              settings=dict(max_episodes=base.max_episodes, total_steps=base.total_steps,
                            stop_after_solved_episodes=base.stop_after_solved_episodes,
                            mapping_seed=base.mapping_seed, hparams_overrides=base.hparams),
              cells=cells)


def plot(path: Path, result: dict, env: str, agents: list[str], sizes: list) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(figsize=(6, 4))
  if env == "deepsea":
    for agent in agents:
      ax.plot(sizes, [result["solved_fraction"][agent][str(s)] for s in sizes], "o-",
              label=agent)
    ax.set_xlabel("DeepSea size N")
    ax.set_xticks(sizes)
  else:
    ax.bar(agents, [result["solved_fraction"][a]["None"] for a in agents])
  ax.set_ylabel("fraction of seeds solved")
  ax.set_ylim(-0.05, 1.05)
  ax.set_title(f"{env}: goal reached within {result['settings']['max_episodes'] or 'the'} "
               f"episodes ({len(result['seeds'])} seeds)")
  if env == "deepsea":
    ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


def main(argv):
  del argv
  rl_main.quiet_libraries()
  rl_main.enable_compilation_cache(FLAGS.jax_cache_dir)
  base = rl_main.run_config_from_flags()
  flag_checks.record(FLAGS.out_dir, "exploration")
  sizes = [int(s) for s in FLAGS.sizes] if base.env == "deepsea" else [None]
  seeds = list(range(FLAGS.first_seed, FLAGS.first_seed + FLAGS.seeds))
  result = rl_main.exit_on_env_failure(  # a hung VizDoom env ends the grid, games killed
      "benchmarks.exploration",
      lambda: run_grid(base, list(FLAGS.agents), sizes, seeds, Path(FLAGS.out_dir)))
  print(json.dumps({k: result[k] for k in ("solved_fraction", "median_episodes_to_first_success",
                                           "sps", "env_sps", "sps_ratio_to_dqn")}, indent=1))


if __name__ == "__main__":
  define_flags()
  FLAGS.set_default("max_episodes", 3000)
  FLAGS.set_default("stop_after_solved_episodes", 100)
  FLAGS.set_default("out_dir", "out/exploration")
  FLAGS.set_default("checkpoint_every", 0)
  FLAGS.set_default("log_every", 20_000)
  app.run(main)
