r"""Hyper-parameter sweep of one OOD method on data the table never evaluates.

    python -m benchmarks.sweep --config=configs/sweep.py:csd --out_dir=out/sweep_csd

Every setting of ``configs/sweep.py`` (a name and overrides of the method's config) is fitted on
the embedded tasks of the tuning seeds (default 100, 101: seeds the table, 0 .. seeds − 1, does
not use) and scored on the *tuning* parts of every set (as ``benchmarks.ood
--config.split=tune``: disjoint from the evaluated parts and from CSD-OOD's contexts). Writes
``sweep.json`` (every setting: overrides, mean AUROC over (task, pair, seed) cells, the per-pair
AUROCs, AUROC under the method's other scores, fit seconds; and the full config) and ``sweep.md``
(the table, best first). Resumable: each setting's cells live under ``OUT_DIR/<setting>/`` and a
rerun loads them.
"""

from __future__ import annotations

import json
import os
import sys

from absl import flags
from absl import logging
import ml_collections
import numpy as np

from benchmarks import ood_cells
from benchmarks import protocol
from cmdline import cli
from cmdline import flag_checks
from uncertainty_kit import methods
from uncertainty_kit import train

FLAGS = flags.FLAGS


def define_flags() -> None:
  """``--config`` (configs/sweep.py) and ``--out_dir``; called under ``__main__`` only."""
  cli.define_config("sweep")
  flags.DEFINE_string("out_dir", "out/sweep", "Output directory.")
  flag_checks.writable_dir("out_dir")


def check_config(config: ml_collections.ConfigDict) -> dict:
  """The settings to run, {name: overrides}, "default" first; raises ``cli.ConfigError`` naming
  the first bad field."""
  cli.check(config, positive=("num_test",), one_of={"method": methods.METHODS})
  seeds = cli.split_list(config.tune_seeds)
  if not seeds or not all(str(s).isdigit() for s in seeds):
    raise cli.ConfigError(
        "--config.tune_seeds must be a comma-separated list of seeds >= 0, "
        f"got {config.tune_seeds!r}"
    )
  settings = {"default": {}, **cli.to_dict(config.settings)}
  for name, overrides in settings.items():
    try:
      methods.config_for(config.method, overrides)
    except ValueError as e:
      raise cli.ConfigError(f"--config.settings.{name}: {e}") from None
  return settings


def run_setting(method: str, overrides: dict, seeds, out_dir: str, num_test: int) -> dict:
  """Fits ``method`` with ``overrides`` on the tuning seeds; the tuning-split AUROCs."""
  config = methods.config_for(method, overrides)
  records = []
  for seed in seeds:
    for task in protocol.embedded_tasks(seed, num_test=num_test):
      records.append(ood_cells.run_cell(method, config, task, seed, out_dir, split="tune"))
  pairs: dict = {}
  for r in records:
    for pair, m in r["per_pair"].items():
      pairs.setdefault(pair, []).append(m["auroc"])
  by_score: dict = {}
  for r in records:
    for kind, per_pair in r["by_score"].items():
      by_score.setdefault(kind, []).extend(per_pair.values())
  cells = [a for v in pairs.values() for a in v]
  fits = [r["fit_seconds"] for r in records if r["fit_seconds"] is not None]
  return {
      "overrides": overrides,
      "auroc": float(np.mean(cells)),
      "auroc_se": float(np.std(cells) / np.sqrt(len(cells))),
      "num_cells": len(cells),
      "per_pair": {p: float(np.mean(v)) for p, v in pairs.items()},
      "by_score": {k: float(np.mean(v)) for k, v in by_score.items()},
      "fit_seconds": float(np.mean(fits)) if fits else None,
  }


def to_markdown(method: str, results: dict, seeds) -> str:
  best_first = sorted(results, key=lambda n: -results[n]["auroc"])
  pairs = list(results[best_first[0]]["per_pair"])
  lines = [
      f"# Sweep of `{method}` on the tuning parts (seeds {', '.join(map(str, seeds))})",
      "",
      "Mean AUROC (×100) over (task, OOD set, seed) cells of the tuning split, which the "
      "table never evaluates.",
      "",
      "| setting | overrides | AUROC | other scores | fit s | "
      + " | ".join(p.split(":", 1)[1] + f" ({p.split(':')[0]})" for p in pairs)
      + " |",
      "|" + " --- |" * (5 + len(pairs)),
  ]
  for n in best_first:
    r = results[n]
    other = ", ".join(f"{k} {100 * v:.1f}" for k, v in r["by_score"].items()) or "–"
    fit = "–" if r["fit_seconds"] is None else f"{r['fit_seconds']:.0f}"
    lines.append(
        f"| {n} | `{json.dumps(r['overrides'])}` | {100 * r['auroc']:.1f} ± "
        f"{100 * r['auroc_se']:.1f} | {other} | {fit} | "
        + " | ".join(f"{100 * r['per_pair'].get(p, np.nan):.1f}" for p in pairs)
        + " |"
    )
  return "\n".join(lines) + "\n"


def main(argv):
  del argv
  config = FLAGS.config
  settings = check_config(config)
  logging.set_verbosity(logging.WARNING)
  seeds = [int(s) for s in cli.split_list(config.tune_seeds)]
  out_dir = FLAGS.out_dir
  cli.record(out_dir, "sweep", config)
  path = os.path.join(out_dir, "sweep.json")
  results = {}
  if os.path.exists(path):
    with open(path) as f:
      results = {
          n: r for n, r in json.load(f)["results"].items() if r["overrides"] == settings.get(n)
      }
  for name, overrides in settings.items():
    print(f"sweep {config.method}: {name} {json.dumps(overrides)}", file=sys.stderr, flush=True)
    results[name] = run_setting(
        config.method, overrides, seeds, os.path.join(out_dir, name), config.num_test
    )
    print(
        f"sweep {config.method}: {name}: AUROC {100 * results[name]['auroc']:.1f}",
        file=sys.stderr,
        flush=True,
    )
    train.write_json(
        path,
        {
            "method": config.method,
            "seeds": seeds,
            "results": results,
            "config": cli.to_dict(config),
        },
    )
    with open(os.path.join(out_dir, "sweep.md"), "w") as f:
      f.write(to_markdown(config.method, results, seeds))


if __name__ == "__main__":
  define_flags()
  cli.run(main)
