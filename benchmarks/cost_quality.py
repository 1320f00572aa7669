r"""Quality against cost: mean AUROC against fit seconds, CSD against ensembles, in one run.

    python -m benchmarks.cost_quality --out_dir=out/cost_quality
    python -m benchmarks.cost_quality --config=configs/cost_quality.py:quick --out_dir=/tmp/cq

The picture a user chooses a method by: every point is one method at one budget, fitted on the
embedded tasks of the config's seeds in this process, on this machine, and scored on the
evaluated parts of every OOD set (``benchmarks.ood_cells.run_cell``, so points are resumable).

* CSD, CSD-Aug, CSD-OOD at each of ``csd_steps`` (g's steps; the anneal follows the budget);
* ENS(M) for M in ``ensemble_sizes`` (its default score, mutual information; ENS(1) by entropy);
* MC dropout (its own defaults).

A point's fit seconds are the wall-clock of its whole fit, compilation included, averaged over
cells; CSD's include its classifier (the accuracy column's network), trained afresh for every
cell (the kit's classifier cache is cleared before each fit). Writes ``cost_quality.json``
(points, per-pair AUROCs, which ENS points a CSD point dominates) and ``cost_quality.png``.
"""

from __future__ import annotations

import os
import sys

from absl import flags
import ml_collections
import numpy as np

from benchmarks import ood_cells
from benchmarks import protocol
from cmdline import cli
from cmdline import flag_checks
from uncertainty_kit import methods
from uncertainty_kit import train

FLAGS = flags.FLAGS
NAME = "cost_quality"
CSD_VARIANTS = ("csd", "csd_aug", "csd_ood")


def define_flags() -> None:
  """``--config`` (configs/cost_quality.py) and ``--out_dir``; called under ``__main__`` only."""
  cli.define_config(NAME)
  flags.DEFINE_string("out_dir", "out/cost_quality", "Output directory.")
  flag_checks.writable_dir("out_dir")


def check_config(config: ml_collections.ConfigDict) -> None:
  """Raises ``cli.ConfigError`` naming the first bad field, before any work."""
  cli.check(
      config,
      positive=("seeds", "num_test", "train_steps"),
      subset_of={"csd_variants": CSD_VARIANTS},
  )
  for path in ("csd_steps", "ensemble_sizes"):
    values = cli.split_list(config[path])
    if not values or not all(isinstance(v, int) and v > 0 for v in values):
      raise cli.ConfigError(
          f"--config.{path} must be a non-empty list of positive integers, " f"got {config[path]!r}"
      )


def points(config: ml_collections.ConfigDict) -> list[tuple[str, str, dict]]:
  """(label, method, overrides) of every point, cheapest budgets first."""
  common = {} if config.train_steps is None else {"train": {"num_steps": config.train_steps}}
  out = []
  for name in cli.split_list(config.csd_variants):
    for steps in cli.split_list(config.csd_steps):
      out.append((f"{name}@{steps}", name, {**common, "num_steps": int(steps)}))
  for m in cli.split_list(config.ensemble_sizes):
    # one member has no disagreement (mutual information ≡ 0): it is scored by its entropy
    score = {"score": "entropy"} if int(m) == 1 else {}
    out.append((f"ens{m}", "ens15", {**common, "num_members": int(m), **score}))
  if config.mc_dropout:
    out.append(("mc_dropout", "mc_dropout", dict(common)))
  return out


def family(label: str) -> str:
  """The curve a point belongs to: its CSD variant, "ens" or "mc_dropout"."""
  return label.split("@")[0] if "@" in label else ("ens" if label.startswith("ens") else label)


def run_point(method: str, overrides: dict, config, out_dir: str) -> dict:
  """Fits and scores one point on every (seed, task); its mean AUROC and fit seconds."""
  method_config = methods.config_for(method, overrides)
  records = []
  for seed in range(config.seeds):
    for task in protocol.embedded_tasks(seed, num_test=config.num_test, max_train=config.max_train):
      train.clear_classifier_cache()  # every fit pays for its own classifier
      records.append(ood_cells.run_cell(method, method_config, task, seed, out_dir))
  aurocs = [m["auroc"] for r in records for m in r["per_pair"].values()]
  fits = [r["fit_seconds"] for r in records if r["fit_seconds"] is not None]
  return {
      "method": method,
      "overrides": overrides,
      "auroc": float(np.mean(aurocs)),
      "auroc_se": float(np.std(aurocs) / np.sqrt(len(aurocs))),
      "num_cells": len(aurocs),
      "fit_seconds": float(np.mean(fits)) if len(fits) == len(records) else None,
      "per_pair": {
          p: float(np.mean([r["per_pair"][p]["auroc"] for r in records if p in r["per_pair"]]))
          for r in records
          for p in r["per_pair"]
      },
  }


def dominance(results: dict) -> dict:
  """For each ENS point, the CSD points with a higher AUROC at fewer fit seconds."""
  out = {}
  for label, r in results.items():
    if family(label) != "ens" or r["fit_seconds"] is None:
      continue
    out[label] = sorted(
        c
        for c, s in results.items()
        if family(c) in CSD_VARIANTS
        and s["fit_seconds"] is not None
        and s["auroc"] > r["auroc"]
        and s["fit_seconds"] < r["fit_seconds"]
    )
  return out


def plot(results: dict, path: str) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(figsize=(6.4, 4.2))
  styles = {
      "csd": ("C3", "o"),
      "csd_aug": ("C1", "s"),
      "csd_ood": ("C2", "^"),
      "ens": ("C0", "D"),
      "mc_dropout": ("C7", "x"),
  }
  for fam, (color, marker) in styles.items():
    pts = sorted(
        (r["fit_seconds"], r["auroc"], label)
        for label, r in results.items()
        if family(label) == fam and r["fit_seconds"] is not None
    )
    if not pts:
      continue
    xs, ys, labels = zip(*pts)
    ax.plot(xs, [100 * y for y in ys], marker=marker, color=color, label=fam)
    for x, y, label in pts:
      ax.annotate(
          label.split("@")[-1], (x, 100 * y), fontsize=6, xytext=(3, 3), textcoords="offset points"
      )
  ax.set_xscale("log")
  ax.set_xlabel("fit seconds per cell (wall-clock, compilation included)")
  ax.set_ylabel("mean AUROC ×100 over (task, OOD set, seed)")
  ax.legend(fontsize=7)
  ax.grid(alpha=0.3)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def run(config: ml_collections.ConfigDict, out_dir: str) -> dict:
  results = {}
  for label, method, overrides in points(config):
    print(f"cost_quality: {label}", file=sys.stderr, flush=True)
    # each point its own cells and checkpoints (a cell's file name holds no budget)
    results[label] = run_point(method, overrides, config, os.path.join(out_dir, "points", label))
    r = results[label]
    print(
        f"cost_quality: {label}: AUROC {100 * r['auroc']:.1f}, fit "
        f"{r['fit_seconds'] or float('nan'):.1f} s",
        file=sys.stderr,
        flush=True,
    )
  out = {
      "points": results,
      "ens_dominated_by": dominance(results),
      "seeds": config.seeds,
      "config": cli.to_dict(config),
      "note": "fit seconds: wall-clock per (task, seed) cell, compilation included, CSD's "
      "classifier included; AUROC: evaluated parts of every OOD set",
  }
  train.write_json(os.path.join(out_dir, "cost_quality.json"), out)
  if config.plots:
    plot(results, os.path.join(out_dir, "cost_quality.png"))
  return out


def main(argv):
  cli.start(argv, FLAGS.config, FLAGS.out_dir, NAME, check_config)
  run(FLAGS.config, FLAGS.out_dir)


if __name__ == "__main__":
  define_flags()
  cli.run(main)
