r"""Agent env steps/s on DeepSea per agent and size, with the nets' first layer gathering the
rows of the one-hot inputs or multiplying them (``rl.deepsea.learner_config``'s
``gather_one_hot``), side by side in one run.

    python -m benchmarks.deepsea_throughput --out_dir=docs/results/deepsea_throughput

Each cell runs the agent's jitted collect-and-learn chunks (``rl.dqn.make_chunk``, as
``rl.deepsea`` does, without its logging and checkpoints): ``warmup_chunks`` to compile and
pass ``learning_starts``, then ``timed_chunks`` timed. Writes ``deepsea_throughput.json`` (per
cell: sps and, for ``gather``, its ratio to ``dense`` at the same agent and size) and
``deepsea_throughput.png`` (sps against size).
"""

from __future__ import annotations

import json
import pathlib
import time

import jax
import matplotlib
import ml_collections
from absl import app
from absl import flags

from configs import deepsea as deepsea_configs
from rl import deepsea
from rl import dqn
from uncertainty_kit import cli
from uncertainty_kit import flag_checks

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the file-only backend)

FLAGS = flags.FLAGS
NAME = "deepsea_throughput"
FIRST_LAYERS = ("dense", "gather")


def define_flags() -> flags.FlagHolder:
  """``--out_dir`` and ``--config`` (configs/deepsea_throughput.py); under ``__main__`` only."""
  flags.DEFINE_string("out_dir", "out/deepsea_throughput", "Output directory.")
  flag_checks.writable_dir("out_dir")
  return cli.define_config(NAME)


def check(config: ml_collections.ConfigDict) -> None:
  """Raises ``cli.ConfigError`` naming the first bad field."""
  cli.check(config, positive=["chunk_steps", "timed_chunks"], non_negative=["warmup_chunks"],
            subset_of={"agents": deepsea_configs.AGENTS, "first_layers": FIRST_LAYERS})
  sizes = cli.split_list(config.sizes)
  if not sizes or not all(s.isdigit() and int(s) > 0 for s in sizes):
    raise cli.ConfigError(f"--config.sizes must be a list of positive integers, got "
                          f"{config.sizes!r}")


def time_cell(agent: str, size: int, gather: bool, config: ml_collections.ConfigDict) -> float:
  """Agent env steps/s of ``agent`` on DeepSea-``size`` (seed 0), learning included."""
  run = deepsea_configs.get_config(agent)
  run.size = size
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


def run_cells(config: ml_collections.ConfigDict, out_dir: str | pathlib.Path,
              verbose: bool = True) -> dict:
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
          print(f"{agent:>7} DeepSea-{size:<3} {layer:>6}: {sps:8.0f} agent env steps/s",
                flush=True)
  for r in rows:
    dense = next((d for d in rows if d["agent"] == r["agent"] and d["size"] == r["size"]
                  and d["first_layer"] == "dense"), None)
    r["ratio_to_dense"] = r["sps"] / dense["sps"] if dense else None
  result = dict(rows=rows, backend=jax.default_backend(),
                devices=[str(d) for d in jax.devices()], config=cli.to_dict(config))
  (out / f"{NAME}.json").write_text(json.dumps(result, indent=1))
  plot(rows, out / f"{NAME}.png")
  return result


def plot(rows: list[dict], path: pathlib.Path) -> None:
  """sps against size per agent: solid for the gathering first layer, dashed for dense."""
  fig, ax = plt.subplots(figsize=(7.5, 4))
  agents = list(dict.fromkeys(r["agent"] for r in rows))
  for i, agent in enumerate(agents):
    for layer, style in (("gather", "-"), ("dense", "--")):
      pts = sorted((r["size"], r["sps"]) for r in rows
                   if r["agent"] == agent and r["first_layer"] == layer)
      if pts:
        ax.plot(*zip(*pts), style, marker="o", color=f"C{i}",
                label=f"{agent} ({layer})")
  ax.set_yscale("log")
  ax.set_xlabel("DeepSea size N (input width N²)")
  ax.set_ylabel("agent env steps / s (learning included)")
  ax.set_title(f"DeepSea throughput ({jax.default_backend()})")
  ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def main(argv, config: ml_collections.ConfigDict):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  check(config)
  cli.record(FLAGS.out_dir, NAME, config)
  run_cells(config, FLAGS.out_dir)


if __name__ == "__main__":
  config_flag = define_flags()
  cli.run(lambda argv: main(argv, config_flag.value))
