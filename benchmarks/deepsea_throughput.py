r"""Agent env steps/s on DeepSea per agent and size, with the nets' first layer gathering the
rows of the one-hot inputs or multiplying them (``rl.deepsea.learner_config``'s
``gather_one_hot``), side by side in one run; or (profile ``seeds``) S seeds as one vmapped
program against one process per seed.

    python -m benchmarks.deepsea_throughput --out_dir=docs/results/deepsea_throughput
    python -m benchmarks.deepsea_throughput --config=configs/deepsea_throughput.py:seeds \
        --out_dir=docs/results/deepsea_seeds_throughput

Each cell runs the agent's jitted collect-and-learn chunks (``rl.dqn.make_chunk``, as
``rl.deepsea`` does, without its logging and checkpoints): ``warmup_chunks`` to compile and
pass ``learning_starts``, then ``timed_chunks`` timed. Writes ``deepsea_throughput.json`` (per
cell: sps and, for ``gather``, its ratio to ``dense`` at the same agent and size) and
``deepsea_throughput.png`` (sps against size).

The ``seeds`` profile (``run_seeds``) times, per agent at one size, S seeds as one program
(``rl.dqn.make_seeds_chunk``: ``warmup_chunks``, then ``timed_chunks`` timed) for each S in
``seed_groups``, and ``baseline_runs`` one-seed runs as separate processes, two at a time with
single-threaded XLA (as ``benchmarks.exploration`` runs its cells with ``--config.workers=2``),
each timing its own chunks the same way. The one-process grid's rate is the two concurrent
processes' summed steady-state rates (twice their mean); it does not depend on S. Writes
``deepsea_seeds_throughput.json`` (per agent and S: the vmapped program's env steps/s, the
grid's, their ratio, and both end-to-end wall times, start-up and compiling included).
``--config.seed_mesh=seeds=D`` shards the vmapped program's seed axis over D devices (on CPU:
``XLA_FLAGS=--xla_force_host_platform_device_count=D``, one device per core).
"""

from __future__ import annotations

import concurrent.futures
import json
import multiprocessing
import os
import pathlib
import platform
import time

import jax
import jax.numpy as jnp
import matplotlib
import ml_collections
from absl import flags

from configs import deepsea as deepsea_configs
from rl import agents
from rl import deepsea
from rl import dqn
from rl import run_config
from cmdline import cli

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the file-only backend)

FLAGS = flags.FLAGS
NAME = "deepsea_throughput"
FIRST_LAYERS = ("dense", "gather")


def define_flags() -> flags.FlagHolder:
  """``--out_dir`` and ``--config`` (configs/deepsea_throughput.py); under ``__main__`` only."""
  return cli.define_out_dir_and_config(NAME)


def check(config: ml_collections.ConfigDict) -> None:
  """Raises ``cli.ConfigError`` naming the first bad field."""
  cli.check(
      config,
      positive=["chunk_steps", "timed_chunks"],
      non_negative=["warmup_chunks"],
      subset_of={"agents": agents.NAMES, "first_layers": FIRST_LAYERS},
  )
  if config.get("seed_groups"):
    cli.check(config, positive=["baseline_runs", "processes"])
    groups = cli.split_list(config.seed_groups)
    if not all(g.isdigit() and int(g) > 1 for g in groups):
      raise cli.ConfigError(
          f"--config.seed_groups must list seed counts > 1, got " f"{config.seed_groups!r}"
      )
  sizes = cli.split_list(config.sizes)
  if not sizes or not all(s.isdigit() and int(s) > 0 for s in sizes):
    raise cli.ConfigError(
        f"--config.sizes must be a list of positive integers, got " f"{config.sizes!r}"
    )


def run_of(agent: str, **fields) -> run_config.DeepSea:
  """``agent``'s DeepSea run (``configs/deepsea.py``) with ``fields`` changed, checked."""
  run = deepsea_configs.get_config(agent)
  run.update(fields)
  return run_config.from_config(run_config.DeepSea, run)


def time_cell(agent: str, size: int, gather: bool, config: ml_collections.ConfigDict) -> float:
  """Agent env steps/s of ``agent`` on DeepSea-``size`` (seed 0), learning included."""
  run = run_of(agent, size=size)
  cfg = deepsea.learner_config(run, gather_one_hot=gather)
  loop, env_step = deepsea.initial_loop(run, cfg)
  chunk = dqn.make_chunk(cfg, env_step, int(config.chunk_steps))
  for _ in range(int(config.warmup_chunks)):
    loop, rec = chunk(loop)
  jax.block_until_ready(rec if config.warmup_chunks else loop)
  start = time.perf_counter()
  for _ in range(int(config.timed_chunks)):
    loop, rec = chunk(loop)
  jax.block_until_ready(rec)
  steps = int(config.timed_chunks) * int(config.chunk_steps) * cfg.num_envs
  return steps / (time.perf_counter() - start)


def _time_chunks(chunk, state, config: ml_collections.ConfigDict, *args):
  """(state, seconds) of ``timed_chunks`` calls of ``chunk`` after ``warmup_chunks``."""
  rec = None
  for _ in range(int(config.warmup_chunks)):
    state, rec = chunk(state, *args)
  jax.block_until_ready(rec if rec is not None else state)
  start = time.perf_counter()
  for _ in range(int(config.timed_chunks)):
    state, rec = chunk(state, *args)
  jax.block_until_ready(rec)
  return state, time.perf_counter() - start


def time_group(agent: str, size: int, num_seeds: int, config: ml_collections.ConfigDict) -> dict:
  """Env steps/s (summed over seeds) of seeds 0 .. num_seeds - 1 as one vmapped program, and
  its wall time from building the state (compiling included) to the end."""
  t0 = time.perf_counter()
  run = run_of(agent, size=size)
  cfg = deepsea.learner_config(run)
  loops, env_step = deepsea.initial_loops(run, cfg, list(range(num_seeds)))
  sharding = deepsea.seed_sharding(config.get("seed_mesh", ""), num_seeds)
  if sharding is not None:  # the seed axis over the mesh's devices
    loops = jax.device_put(loops, sharding)
  chunk = dqn.make_seeds_chunk(cfg, env_step, int(config.chunk_steps))
  _, seconds = _time_chunks(chunk, loops, config, jnp.ones(num_seeds, bool))
  steps = num_seeds * int(config.timed_chunks) * int(config.chunk_steps) * cfg.num_envs
  return dict(sps=steps / seconds, wall_s=time.perf_counter() - t0)


def _time_one_seed_process(agent: str, size: int, seed: int, config: dict) -> dict:
  """In a worker process: one seed's env steps/s (``time_cell``'s chunks) and the process's
  wall time from its start (JAX import and compiling included)."""
  config = ml_collections.ConfigDict(config)
  run = run_of(agent, size=size, seed=seed)
  cfg = deepsea.learner_config(run)
  loop, env_step = deepsea.initial_loop(run, cfg)
  _, seconds = _time_chunks(dqn.make_chunk(cfg, env_step, int(config.chunk_steps)), loop, config)
  steps = int(config.timed_chunks) * int(config.chunk_steps) * cfg.num_envs
  return dict(seed=seed, sps=steps / seconds, wall_s=time.time() - _PROCESS_START[0])


_PROCESS_START = [time.time()]


def _grid_worker() -> None:
  """A grid worker (``benchmarks.exploration._single_threaded``), its clock started."""
  _PROCESS_START[0] = time.time()
  os.environ["XLA_FLAGS"] = (
      os.environ.get("XLA_FLAGS", "")
      + " --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
  )


def time_processes(agent: str, size: int, config: ml_collections.ConfigDict) -> dict:
  """``baseline_runs`` one-seed runs, ``processes`` at a time in fresh single-threaded worker
  processes (one per run, as separate ``rl.deepsea`` runs): the grid's steady-state env steps/s
  (``processes`` times the mean per-process rate) and the batch's wall time."""
  t0 = time.perf_counter()
  ctx = multiprocessing.get_context("spawn")
  runs = []
  seeds = list(range(int(config.baseline_runs)))
  for i in range(0, len(seeds), int(config.processes)):  # a fresh pool: one process per run
    batch = seeds[i : i + int(config.processes)]
    with concurrent.futures.ProcessPoolExecutor(
        len(batch), mp_context=ctx, initializer=_grid_worker
    ) as pool:
      runs += list(
          pool.map(
              _time_one_seed_process,
              [agent] * len(batch),
              [size] * len(batch),
              batch,
              [config.to_dict()] * len(batch),
          )
      )
  per_process = [r["sps"] for r in runs]
  return dict(
      sps=int(config.processes) * sum(per_process) / len(per_process),
      per_process_sps=per_process,
      wall_s=time.perf_counter() - t0,
      process_wall_s=[r["wall_s"] for r in runs],
  )


def run_seeds(
    config: ml_collections.ConfigDict, out_dir: str | pathlib.Path, verbose: bool = True
) -> dict:
  """The ``seeds`` profile (module docstring): returns (and writes) the table."""
  check(config)
  out = pathlib.Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  size = int(config.sizes)
  rows = []
  for agent in cli.split_list(config.agents):
    grid = time_processes(agent, size, config)
    if verbose:
      print(
          f"{agent:>7} DeepSea-{size}: one process per seed, {config.processes} at a time: "
          f"{grid['sps']:8.0f} env steps/s ({grid['per_process_sps']} per process)",
          flush=True,
      )
    for num_seeds in (int(g) for g in cli.split_list(config.seed_groups)):
      group = time_group(agent, size, num_seeds, config)
      rows.append(
          dict(
              agent=agent,
              size=size,
              seeds=num_seeds,
              vmapped_sps=group["sps"],
              grid_sps=grid["sps"],
              ratio=group["sps"] / grid["sps"],
              vmapped_wall_s=group["wall_s"],
              grid_wall_s=grid["wall_s"] * num_seeds / len(grid["per_process_sps"]),
              grid_per_process_sps=grid["per_process_sps"],
          )
      )
      if verbose:
        print(
            f"{agent:>7} DeepSea-{size}: {num_seeds} seeds vmapped: {group['sps']:8.0f} env "
            f"steps/s, {rows[-1]['ratio']:.2f}x the grid",
            flush=True,
        )
  cpu = next(
      (
          line.split(":", 1)[1].strip()
          for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines()
          if line.startswith("model name")
      ),
      platform.processor(),
  )
  result = dict(
      rows=rows,
      cpu=cpu,
      cores=os.cpu_count(),
      devices=jax.device_count(),
      load_average=list(os.getloadavg()),
      backend=jax.default_backend(),
      config=cli.to_dict(config),
  )
  (out / "deepsea_seeds_throughput.json").write_text(json.dumps(result, indent=1))
  return result


def run_cells(
    config: ml_collections.ConfigDict, out_dir: str | pathlib.Path, verbose: bool = True
) -> dict:
  """Times every (agent, size, first layer) cell; returns (and writes) the table."""
  check(config)
  out = pathlib.Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  rows = []
  for agent in cli.split_list(config.agents):
    for size in (int(s) for s in cli.split_list(config.sizes)):
      for layer in cli.split_list(config.first_layers):
        sps = time_cell(agent, size, layer == "gather", config)
        rows.append(dict(agent=agent, size=size, first_layer=layer, sps=sps))
        if verbose:
          print(
              f"{agent:>7} DeepSea-{size:<3} {layer:>6}: {sps:8.0f} agent env steps/s", flush=True
          )
  for r in rows:
    dense = next(
        (
            d
            for d in rows
            if d["agent"] == r["agent"] and d["size"] == r["size"] and d["first_layer"] == "dense"
        ),
        None,
    )
    r["ratio_to_dense"] = r["sps"] / dense["sps"] if dense else None
  result = dict(
      rows=rows,
      backend=jax.default_backend(),
      devices=[str(d) for d in jax.devices()],
      config=cli.to_dict(config),
  )
  (out / f"{NAME}.json").write_text(json.dumps(result, indent=1))
  plot(rows, out / f"{NAME}.png")
  return result


def plot(rows: list[dict], path: pathlib.Path) -> None:
  """sps against size per agent: solid for the gathering first layer, dashed for dense."""
  fig, ax = plt.subplots(figsize=(7.5, 4))
  agents = list(dict.fromkeys(r["agent"] for r in rows))
  for i, agent in enumerate(agents):
    for layer, style in (("gather", "-"), ("dense", "--")):
      pts = sorted(
          (r["size"], r["sps"]) for r in rows if r["agent"] == agent and r["first_layer"] == layer
      )
      if pts:
        ax.plot(*zip(*pts), style, marker="o", color=f"C{i}", label=f"{agent} ({layer})")
  ax.set_yscale("log")
  ax.set_xlabel("DeepSea size N (input width N²)")
  ax.set_ylabel("agent env steps / s (learning included)")
  ax.set_title(f"DeepSea throughput ({jax.default_backend()})")
  ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def main(argv, config: ml_collections.ConfigDict):
  cli.start(argv, config, FLAGS.out_dir, NAME, check)
  if config.get("seed_groups"):
    run_seeds(config, FLAGS.out_dir)
  else:
    run_cells(config, FLAGS.out_dir)


if __name__ == "__main__":
  config_flag = define_flags()
  cli.run(lambda argv: main(argv, config_flag.value))
