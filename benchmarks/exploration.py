r"""The exploration grid: agents x DeepSea sizes x seeds (or agents x seeds on VizDoom).

    python -m benchmarks.exploration --config.sizes=10,20,30 --config.seeds=5 \
        --out_dir=out/exploration
    python -m benchmarks.exploration --config=configs/exploration.py:vizdoom \
        --config.variant=very_sparse --config.seeds=3 --config.total_steps=2000000 \
        --out_dir=out/doom      # a GPU machine

The config is ``configs/exploration.py``. Every cell is one seed's run of an agent on a size,
written to ``OUT_DIR/<env>/<agent>/size<N>/seed<s>/`` (VizDoom: ``OUT_DIR/doom_<variant>/<agent>/
seed<s>/``). On DeepSea the unfinished seeds of an (agent, size) run together as one program
vmapped over seeds (``rl.deepsea.train_seeds``, ``--config.vmap_seeds``; each seed's folder
as a one-seed run writes it, the group's checkpoints in ``.../size<N>/seeds<a>_<b>..._/``); a
cell that holds a one-seed run's checkpoint (an older grid's, interrupted) resumes alone. Without
``vmap_seeds``, and on VizDoom, each cell is one ``rl.deepsea.train`` (``rl.vizdoom.train``) run,
in this process so that the compiled training loop is reused across seeds. With
``--config.workers=W`` > 1, W worker processes run the groups or cells (DeepSea only; each
worker's XLA:CPU runs single-threaded). The grid is resumable per cell: a cell whose
``summary.json`` holds the same config (``rl.run_config.same_config``) is skipped, an
interrupted one resumes from its (its group's) checkpoint. ``--config.report_only`` runs nothing: it
aggregates the finished cells and lists the others under ``missing_cells`` (for a grid cut short
by a time limit, or one run in parts: several grids into one folder).

Writes ``OUT_DIR/exploration.json``: ``solved_fraction[agent][size]``,
``median_episodes_to_first_success[agent][size]`` (over the seeds that solved),
``max_right_moves[agent][size]`` (DeepSea: per finished seed whose summary has it, the most right
moves in one episode, N at the treasure: how close an unsolved seed came),
``bsuite_solved_fraction[agent][size]`` (DeepSea: of the finished seeds whose summary has it, the
fraction that met bsuite's criterion, ``rl.records.bsuite_learned_episode``; it needs runs that go
on after their first success, ``--config.stop_after_solved_episodes=-1``, and may stop at
that episode, ``--config.stop_when_learned=True``),
``sps[agent][size]`` (mean agent env steps/s), ``env_sps`` (raw env steps/s),
``sps_ratio_to_dqn``, the per-cell summaries and the config; and ``OUT_DIR/exploration.png``
(solved fraction vs size per agent; VizDoom: per agent, and each cell's success rate over the
last 100 episodes vs game frames).
"""

from __future__ import annotations

import concurrent.futures
import functools
import json
import multiprocessing
import os
import sys
import time
from pathlib import Path
from typing import Callable

import matplotlib
import ml_collections
import numpy as np
from absl import flags

from rl import agents as agents_lib
from rl import deepsea
from rl import run_config
from rl import startup
from rl import vizdoom
from cmdline import cli
from configs import exploration as exploration_configs

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the file-only backend)

FLAGS = flags.FLAGS


def check(config: cli.ConfigDict) -> None:
  """Raises ``cli.ConfigError`` naming the first bad field of the grid (each cell's run config
  is checked as ``run_grid`` converts it, before any cell runs)."""
  cli.check(
      config,
      positive=["seeds", "total_steps", "log_every", "workers"],
      non_negative=["first_seed", "max_episodes", "checkpoint_every"],
      subset_of={"agents": [a for a in agents_lib.NAMES if a in config.runs]},
  )
  if config.workers > 1 and config.env != "deepsea":
    raise cli.ConfigError(
        "--config.workers > 1 runs DeepSea cells only (VizDoom's envpool "
        "games run in their own processes)"
    )
  if config.env == "deepsea":
    sizes = cli.split_list(config.sizes)
    if not sizes or not all(s.isdigit() and int(s) > 0 for s in sizes):
      raise cli.ConfigError(
          f"--config.sizes must be a comma-separated list of positive "
          f"integers, got {config.sizes!r}"
      )


def resolve_setting(config: cli.ConfigDict) -> cli.ConfigDict:
  """``config``, or on VizDoom where its profile left the runs' setting to JAX
  (``rl.agents.AUTO``), the profile rebuilt with ``configs/vizdoom.py``'s ``default_setting()``
  and the command line's ``--config.`` overrides. Call after ``rl.startup.setup()``, as
  ``rl.vizdoom.resolve_setting``; the cells refuse an unresolved setting."""
  if config.env != "vizdoom" or all(r.setting != agents_lib.AUTO for r in config.runs.values()):
    return config
  from configs import vizdoom as vizdoom_configs  # pylint: disable=g-import-not-at-top

  return cli.reload_config(f"vizdoom,{vizdoom_configs.default_setting()}")


def sizes_of(config: cli.ConfigDict) -> list[int | None]:
  """DeepSea's sizes; [None] on VizDoom (no size level)."""
  return [int(s) for s in cli.split_list(config.sizes)] if config.env == "deepsea" else [None]


def cell_config(
    config: cli.ConfigDict, agent: str, size: int | None, seed: int
) -> run_config.RunConfig:
  """The run config of one cell: ``config.runs[agent]`` plus the fields the grid sets, converted
  and checked (``rl.run_config.from_config``)."""
  cell = ml_collections.ConfigDict(config.runs[agent].to_dict())
  cell.seed = seed
  cell.total_steps = config.total_steps
  for field in exploration_configs.COPIED_FIELDS:
    if field in config:
      cell[field] = config[field]
  if size is not None:  # DeepSea: enough steps for max_episodes episodes of size + 1 steps
    cell.num_seeds = 1  # a cell is one seed; a group of them runs as rl.deepsea.train_seeds
    cell.size = size
    e = cell.dqn.num_envs
    need = (config.max_episodes * (size + 1) // e + 2) * e if config.max_episodes else 0
    cell.total_steps = max(config.total_steps, need)
  kind = run_config.DeepSea if size is not None else run_config.VizDoom
  return run_config.from_config(kind, cell)


def cell_dir(out_dir: Path, env: str, agent: str, size: int | None, seed: int) -> Path:
  d = out_dir / env / agent
  if size is not None:
    d = d / f"size{size}"
  return d / f"seed{seed}"


def run_grid(
    config: cli.ConfigDict,
    out_dir: str | Path,
    *,
    checkpoint_dir: str | None = None,
    tensorboard: bool = True,
    mesh: str = "",
    verbose: bool = True,
) -> dict:
  """Runs (or skips finished) cells; returns and writes the aggregate."""
  check(config)
  out_dir = Path(out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  env_name = "deepsea" if config.env == "deepsea" else f"doom_{config.variant}"
  agents, sizes = cli.split_list(config.agents), sizes_of(config)
  seeds = list(range(config.first_seed, config.first_seed + config.seeds))
  t_grid = time.perf_counter()
  keys = [(agent, size, seed) for size in sizes for agent in agents for seed in seeds]
  todo, done = [], {}
  for key in keys:
    agent, size, seed = key
    cell = cell_config(config, agent, size, seed)
    cell_out = cell_dir(out_dir, env_name, agent, size, seed)
    # one checkpoint folder per cell, mirroring the cell folders
    cell_ckpt = (
        str(Path(checkpoint_dir) / cell_out.relative_to(out_dir)) if checkpoint_dir else None
    )
    summary_path = cell_out / "summary.json"
    if summary_path.exists():
      old = json.loads(summary_path.read_text())
      if run_config.same_config(old.get("config", {}), run_config.to_dict(cell)):
        done[key] = old
        print(f"[grid] {agent} size {size} seed {seed}: done, skipped", file=sys.stderr)
        continue
    todo.append((key, cell, str(cell_out), cell_ckpt))
  if not config.report_only:
    run = functools.partial(
        _run_cell, config.env, tensorboard=tensorboard, mesh=mesh, verbose=verbose
    )
    if config.env == "deepsea" and config.get("vmap_seeds", False):
      todo = seed_groups(todo, out_dir, checkpoint_dir)
    done.update(_run_cells(todo, run, config.workers))
  cells: dict[str, dict[str, list]] = {}
  for agent, size, seed in (key for key in keys if key in done):
    cells.setdefault(agent, {}).setdefault(str(size), []).append(done[(agent, size, seed)])
  result = aggregate(cells, config, env_name, agents, sizes, seeds)
  result["missing_cells"] = [f"{a} size {n} seed {k}" for a, n, k in keys if (a, n, k) not in done]
  result["grid_wall_s_this_invocation"] = time.perf_counter() - t_grid
  curves = {}
  if config.env != "deepsea":
    finished = [key for key in keys if key in done]
    curves = {
        key: episode_records(cell_dir(out_dir, env_name, *key), done[key]) for key in finished
    }
    result["frame_skip"] = next(
        (done[k]["config"].get("pixels", {}).get("frame_skip", 1) for k in finished), 1
    )
    budget = result["frame_budget"] = config.total_steps * result["frame_skip"]  # 0: by episodes
    lates = {k: late_success(*c, budget) if c and budget else None for k, c in curves.items()}
    result["last_quarter_success"] = late_success_rates(lates, agents)
    if budget:
      result["successes_per_tenth"] = successes_per_tenth(curves, budget)
  (out_dir / "exploration.json").write_text(json.dumps(result, indent=1, default=str))
  plot(out_dir / "exploration.png", result, env_name, agents, sizes, curves)
  return result


def episode_records(cell_out: Path, summary: dict) -> tuple[np.ndarray, np.ndarray] | None:
  """(game frames at each episode's end (E,), success (E,) bool) from the cell's
  ``episodes.json``; None without it, or before the first episode ends. Frames = env steps x
  the frame skip."""
  path = cell_out / "episodes.json"
  if not path.exists():
    return None
  ep = json.loads(path.read_text())
  if not ep["success"]:  # no episode has ended (a short run)
    return None
  skip = summary["config"].get("pixels", {}).get("frame_skip", 1)
  return np.asarray(ep["end_step"]) * skip, np.asarray(ep["success"], bool)


def binned_successes(
    frames: np.ndarray, success: np.ndarray, edges: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
  """(successes, episodes) among the episodes that ended in each bin [edges[i], edges[i + 1]):
  two int arrays (len(edges) - 1,)."""
  which = np.digitize(frames, edges) - 1
  inside = (which >= 0) & (which < len(edges) - 1)
  n = np.bincount(which[inside], minlength=len(edges) - 1)
  k = np.bincount(which[inside], weights=success[inside], minlength=len(edges) - 1)
  return k.astype(int), n


def binned_success_rate(frames: np.ndarray, success: np.ndarray, edges: np.ndarray) -> np.ndarray:
  """The success rate of the episodes that ended in each bin [edges[i], edges[i + 1]), NaN
  where none did: (len(edges) - 1,)."""
  k, n = binned_successes(frames, success, edges)
  with np.errstate(invalid="ignore", divide="ignore"):
    return np.where(n > 0, k / np.maximum(n, 1), np.nan)


def successes_per_tenth(curves: dict, budget: float) -> dict:
  """Per agent and seed, the successes among the episodes that ended in each tenth of a budget
  of ``budget`` game frames (the last tenth includes its end): {agent: {seed: [10 ints]}}, from
  ``curves`` ({(agent, size, seed): episode_records(...) or None}); a run without records is
  left out."""
  edges = np.linspace(0.0, budget, 11)
  edges[-1] = np.nextafter(budget, np.inf)
  out: dict = {}
  for (agent, _, seed), records in sorted(curves.items()):
    if records is not None:
      out.setdefault(agent, {})[str(seed)] = binned_successes(*records, edges)[0].tolist()
  return out


def late_success(
    frames: np.ndarray, success: np.ndarray, budget: float, fraction: float = 0.25
) -> tuple[int, int]:
  """(successes, episodes) among the episodes (``episode_records``) that ended in the last
  ``fraction`` of a budget of ``budget`` game frames."""
  late = frames > (1.0 - fraction) * budget
  return int(np.sum(success & late)), int(np.sum(late))


def late_success_rates(lates: dict, agents: list[str]) -> dict:
  """Per agent, from ``lates`` ({(agent, size, seed): late_success(...)}): each seed's success
  rate over the last quarter of the budget, their mean and standard error over seeds, and the
  pooled successes and episodes."""
  out = {}
  for agent in agents:
    runs = [v for (a, _, _), v in sorted(lates.items()) if a == agent and v and v[1]]
    rates = [k / n for k, n in runs]
    se = float(np.std(rates, ddof=1) / np.sqrt(len(rates))) if len(rates) > 1 else None
    out[agent] = dict(
        rates=rates,
        mean=float(np.mean(rates)) if rates else None,
        se=se,
        successes=sum(k for k, _ in runs),
        episodes=sum(n for _, n in runs),
    )
  return out


def seed_groups(todo: list, out_dir: Path, checkpoint_dir: str | None) -> list:
  """``todo`` (DeepSea cells: (key, cell, cell_out, cell_ckpt)) with the cells of each (agent,
  size) merged into one group, (keys, [cells], [cell_outs], group checkpoint folder), for
  ``rl.deepsea.train_seeds``. A cell holding a one-seed run's checkpoint (an older grid's)
  stays alone, to resume from it; so does a group of one."""
  groups: dict[tuple, list] = {}
  alone = []
  for item in todo:
    (agent, size, _), _, cell_out, cell_ckpt = item
    if any(Path(cell_ckpt or Path(cell_out) / "checkpoints").glob("[0-9]*")):
      alone.append(item)
    else:
      groups.setdefault((agent, size), []).append(item)
  merged = []
  for items in groups.values():
    if len(items) == 1:
      alone.extend(items)
      continue
    keys, cells, outs, _ = zip(*items)
    name = "seeds" + "_".join(str(cell.seed) for cell in cells)
    group_dir = Path(outs[0]).parent / name
    ckpt = (
        Path(checkpoint_dir) / group_dir.relative_to(out_dir) if checkpoint_dir else group_dir
    ) / "checkpoints"
    merged.append((list(keys), list(cells), list(outs), str(ckpt)))
  return merged + alone


def _single_threaded() -> None:
  """A grid worker: XLA:CPU on one thread, so W workers share W cores without contention."""
  os.environ["XLA_FLAGS"] = (
      os.environ.get("XLA_FLAGS", "")
      + " --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
  )


def _run_cells(todo: list, run: Callable[..., dict], workers: int) -> dict:
  """{cell key: summary} of the ``todo`` cells ((key, *run's arguments) each; a seed group:
  (keys, *its arguments), run returning one summary per key), run in this process or, with
  ``workers`` > 1, in that many spawned worker processes."""

  def pairs(key, result):
    return zip(key, result) if isinstance(key, list) else [(key, result)]

  if workers <= 1:
    return {k: s for key, *args in todo for k, s in pairs(key, run(*args))}
  ctx = multiprocessing.get_context("spawn")
  with concurrent.futures.ProcessPoolExecutor(
      workers, mp_context=ctx, initializer=_single_threaded
  ) as pool:
    futures = {pool.submit(run, *args): i for i, (_, *args) in enumerate(todo)}
    return {
        k: s
        for f in concurrent.futures.as_completed(futures)
        for k, s in pairs(todo[futures[f]][0], f.result())
    }


def _run_cell(
    env: str,
    cell: run_config.RunConfig | list,
    cell_out: str | list,
    cell_ckpt: str | None,
    *,
    tensorboard: bool,
    mesh: str,
    verbose: bool,
) -> dict | list[dict]:
  """One cell's run (in this process or a worker's); returns its summary. A seed group (lists
  of cells and their folders): one ``rl.deepsea.train_seeds`` run, its summaries."""
  t = time.perf_counter()
  if isinstance(cell, list):
    summaries = deepsea.train_seeds(
        cell[0],
        cell_out[0],
        seeds=[c.seed for c in cell],
        seed_dirs=cell_out,
        checkpoint_dir=cell_ckpt,
        tensorboard=tensorboard,
        mesh=mesh,
        verbose=verbose,
    )
  else:
    driver = deepsea if env == "deepsea" else vizdoom
    summaries = [
        driver.train(
            cell,
            cell_out,
            checkpoint_dir=cell_ckpt,
            tensorboard=tensorboard,
            mesh=mesh,
            verbose=verbose,
        )
    ]
  for c, summary in zip(cell if isinstance(cell, list) else [cell], summaries):
    print(
        f"[grid] {c.agent} size {getattr(c, 'size', None)} seed {c.seed}: solved "
        f"{summary['solved']} first_success_episode {summary['first_success_episode']} "
        f"episodes {summary['episodes']} sps {summary['sps'] or 0:.0f} "
        f"({time.perf_counter() - t:.0f} s)",
        file=sys.stderr,
        flush=True,
    )
  return summaries if isinstance(cell, list) else summaries[0]


def aggregate(
    cells: dict,
    config: cli.ConfigDict,
    env_name: str,
    agents: list[str],
    sizes: list,
    seeds: list[int],
) -> dict:
  solved, median, sps, env_sps, wall = {}, {}, {}, {}, {}
  finished, closest, learned = {}, {}, {}
  for agent in agents:
    for size in sizes:
      runs = cells.get(agent, {}).get(str(size), [])
      finished.setdefault(agent, {})[str(size)] = len(runs)
      firsts = [r["first_success_episode"] for r in runs if r["solved"]]
      solved.setdefault(agent, {})[str(size)] = len(firsts) / len(runs) if runs else None
      median.setdefault(agent, {})[str(size)] = float(np.median(firsts)) if firsts else None
      moves = [r["max_right_moves"] for r in runs if r.get("max_right_moves") is not None]
      closest.setdefault(agent, {})[str(size)] = moves  # DeepSea; absent from older summaries
      graded = [r["bsuite_learned_episode"] for r in runs if "bsuite_learned_episode" in r]
      learned.setdefault(agent, {})[str(size)] = (
          sum(e is not None for e in graded) / len(graded) if graded else None
      )
      s = [r["sps"] for r in runs if r.get("sps")]
      sps.setdefault(agent, {})[str(size)] = float(np.mean(s)) if s else None
      env_sps.setdefault(agent, {})[str(size)] = (
          float(np.mean([r["env_sps"] for r in runs])) if runs else None
      )
      wall.setdefault(agent, {})[str(size)] = float(np.sum([r["wall_s"] for r in runs]))
  ratio = (
      {
          a: {
              k: (v / sps["dqn"][k] if v and sps.get("dqn", {}).get(k) else None)
              for k, v in sps[a].items()
          }
          for a in agents
      }
      if "dqn" in agents
      else {}
  )
  return dict(
      env=env_name,
      agents=agents,
      sizes=sizes,
      seeds=seeds,
      finished_seeds=finished,
      solved_fraction=solved,
      median_episodes_to_first_success=median,
      max_right_moves=closest,
      bsuite_solved_fraction=learned,
      sps=sps,
      env_sps=env_sps,
      sps_ratio_to_dqn=ratio,
      wall_s_per_cell_sum=wall,
      config=cli.to_dict(config),
      cells=cells,
  )


def plot(
    path: Path,
    result: dict,
    env_name: str,
    agents: list[str],
    sizes: list,
    curves: dict | None = None,
) -> None:
  """DeepSea: fraction of the finished seeds solved (marked "solved/finished" where fewer than
  the grid's seeds finished; dashed: bsuite's criterion where the summaries hold it), median
  episodes to the first success, and the closest approach (``max_right_moves`` / N per seed
  that records it, and their median), vs size per agent.
  VizDoom: ``plot_vizdoom`` (``curves``: {(agent, size, seed): episode_records(...)})."""
  budget = (
      f"{result['config']['max_episodes']} episodes"
      if result["config"]["max_episodes"]
      else f"{result['config']['total_steps']:,} env steps"
  )
  if env_name == "deepsea":
    fig, (ax, ax_ep, ax_mv) = plt.subplots(1, 3, figsize=(16, 4))
    # agents side by side around each size, so that equal fractions do not hide one another
    shift = 0.01 * (max(sizes) - min(sizes) if len(sizes) > 1 else 10)
    for i, agent in enumerate(agents):
      frac = [result["solved_fraction"][agent][str(s)] for s in sizes]
      med = [result["median_episodes_to_first_success"][agent][str(s)] for s in sizes]
      xs = [s + (i - (len(agents) - 1) / 2) * shift for s in sizes]
      (line,) = ax.plot(xs, [np.nan if f is None else f for f in frac], "o-", label=agent)
      strict = [result.get("bsuite_solved_fraction", {}).get(agent, {}).get(str(s)) for s in sizes]
      if any(f is not None for f in strict):  # older grids' summaries lack it
        ax.plot(
            xs,
            [np.nan if f is None else f for f in strict],
            "s--",
            mfc="none",
            color=line.get_color(),
            label=f"{agent}: bsuite's criterion",
        )
      ax_ep.plot(sizes, [np.nan if m is None else m for m in med], "o-", label=agent)
      moves = [[m / s for m in result["max_right_moves"][agent][str(s)]] for s in sizes]
      ax_mv.plot(
          xs,
          [np.median(m) if m else np.nan for m in moves],
          "o-",
          color=line.get_color(),
          label=agent,
      )
      for x, m in zip(xs, moves):
        ax_mv.plot([x] * len(m), m, ".", color=line.get_color(), alpha=0.5, ms=4)
      for x, size, f in zip(xs, sizes, frac):  # a fraction over fewer seeds than the grid's
        n = result["finished_seeds"][agent][str(size)]
        if f is not None and n < len(result["seeds"]):
          ax.annotate(
              f"{round(f * n)}/{n}",
              (x, f),
              textcoords="offset points",
              xytext=(5, -9 - 8 * i),
              fontsize=7,
              color=line.get_color(),
          )
    for a in (ax, ax_ep, ax_mv):
      a.set_xlabel("DeepSea size N")
      a.set_xticks(sizes)
    ax_mv.set_ylabel("most right moves in an episode / N (1: treasure)")
    ax_mv.set_title("closest approach: per seed, and median", fontsize=9)
    ax_ep.set_ylabel("median episodes to first success (solved seeds)")
    if any(
        m
        for per_size in result["median_episodes_to_first_success"].values()
        for m in per_size.values()
    ):
      ax_ep.set_yscale("log")
    ax_ep.legend()
  else:
    plot_vizdoom(path, result, env_name, agents, curves or {}, budget)
    return
  ax.set_ylabel("fraction of seeds solved")
  ax.set_ylim(-0.05, 1.05)
  ax.legend(fontsize=7)
  ax.set_title(f"{env_name}: goal reached within {budget} ({len(result['seeds'])} seeds)")
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


def plot_vizdoom(
    path: Path, result: dict, env_name: str, agents: list[str], curves: dict, budget: str
) -> None:
  """Per agent (one colour; one line style per seed): cumulative successes vs game frames;
  the success rate of the episodes ending in each tenth of the budget, mean over seeds with
  ± 1 s.e.; the success rate over the last quarter of the budget, mean ± 1 s.e. and each
  seed's."""
  fig, (ax_cum, ax_rate, ax_late) = plt.subplots(1, 3, figsize=(16, 4))
  colors = {a: f"C{i}" for i, a in enumerate(agents)}
  ends = [c[0][-1] for c in curves.values() if c is not None]
  edges = np.linspace(0, result["frame_budget"] or max(ends, default=1), 11)
  for agent in agents:
    runs = [(k[2], c) for k, c in sorted(curves.items()) if k[0] == agent and c is not None]
    for seed, (frames, success) in runs:
      ax_cum.step(
          frames,
          np.cumsum(success),
          where="post",
          color=colors[agent],
          lw=1,
          ls=["-", "--", ":", "-."][seed % 4],
          label=f"{agent} seed {seed}",
      )
    if runs:
      rates = np.stack([binned_success_rate(f, s, edges) for _, (f, s) in runs])
      mid = 0.5 * (edges[1:] + edges[:-1])
      mean = np.nanmean(rates, axis=0)
      n = np.sum(np.isfinite(rates), axis=0)
      se = np.nanstd(rates, axis=0, ddof=1) / np.sqrt(n) if len(runs) > 1 else 0 * mean
      ax_rate.plot(mid, mean, "o-", color=colors[agent], label=f"{agent} ({len(runs)} seeds)")
      ax_rate.fill_between(mid, mean - se, mean + se, color=colors[agent], alpha=0.2)
  late = result.get("last_quarter_success", {})
  for i, agent in enumerate(agents):
    entry = late.get(agent) or {}
    if entry.get("mean") is None:
      continue
    ax_late.bar(i, entry["mean"], yerr=entry["se"] or 0.0, color=colors[agent], alpha=0.6)
    ax_late.plot([i] * len(entry["rates"]), entry["rates"], "k.", ms=5)
    solved = result["solved_fraction"][agent]["None"]
    seeds = result["finished_seeds"][agent]["None"]
    ax_late.annotate(
        f"goal reached: {round((solved or 0) * seeds)}/{seeds} seeds",
        (i, 0),
        textcoords="offset points",
        xytext=(0, -28),
        ha="center",
        fontsize=8,
    )
  ax_late.set_xticks(range(len(agents)), agents)
  ax_late.set_ylabel("success rate, last quarter of the budget")
  ax_late.set_title("mean ± 1 s.e. over seeds (dots: seeds)", fontsize=9)
  ax_cum.set_ylabel("successes so far")
  ax_rate.set_ylabel("success rate per tenth of the budget")
  ax_cum.set_title(f"{env_name}: {budget} per seed", fontsize=10)
  ax_rate.set_title("mean ± 1 s.e. over seeds", fontsize=9)
  for ax in (ax_cum, ax_rate):
    ax.set_xlabel("game frames")
    if ax.lines:
      ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


def define_flags() -> None:
  """``--config`` (configs/exploration.py) and where the grid writes; called under
  ``__main__`` only, never at import (tests/test_binaries.py says why)."""
  cli.define_config("exploration")
  startup.define_flags("out/exploration")


def main(argv):
  del argv
  startup.setup()
  config = resolve_setting(FLAGS.config)
  check(config)
  cli.record(FLAGS.out_dir, "exploration", config)

  def grid():
    return run_grid(
        config,
        FLAGS.out_dir,
        checkpoint_dir=FLAGS.checkpoint_dir,
        tensorboard=FLAGS.tensorboard,
        mesh=FLAGS.mesh,
    )

  if config.env == "vizdoom":  # a hung VizDoom env ends the grid, its games killed
    result = vizdoom.exit_on_env_failure("benchmarks.exploration", grid)
  else:
    result = grid()
  print(
      json.dumps(
          {
              k: result[k]
              for k in (
                  "solved_fraction",
                  "bsuite_solved_fraction",
                  "median_episodes_to_first_success",
                  "sps",
                  "env_sps",
                  "sps_ratio_to_dqn",
              )
          },
          indent=1,
      )
  )


if __name__ == "__main__":
  define_flags()
  cli.run(main)
