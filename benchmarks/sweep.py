r"""Hyper-parameter sweep of one OOD method on data the table never evaluates.

    python -m benchmarks.sweep --method=csd --out_dir=out/sweep_csd \
        --settings='{"lr3e-3": {"lr": 3e-3}, "steps1200": {"num_steps": 1200}}'

Every setting (a name and config overrides, as ``benchmarks.ood --overrides`` takes for one
method) is fitted on the embedded tasks of the tuning seeds (default 100, 101: seeds the table,
0 .. seeds − 1, does not use) and scored on the *tuning* parts of every set
(``benchmarks.ood --split=tune``: disjoint from the evaluated parts and from CSD-OOD's contexts).
Writes ``sweep.json`` (every setting: overrides, mean AUROC over (task, pair, seed) cells, the
per-pair AUROCs, AUROC under the method's other scores, fit seconds) and ``sweep.md`` (the table,
best first). Resumable: each setting's cells live under ``OUT_DIR/<setting>/`` and a rerun
loads them.
"""

from __future__ import annotations

import json
import os
import sys

from absl import app
from absl import flags
import numpy as np

from benchmarks import protocol
from benchmarks import ood
from uncertainty_kit import flag_checks
from uncertainty_kit import methods
from uncertainty_kit import train


def define_flags() -> None:
  flags.DEFINE_enum("method", "csd", list(methods.METHODS), "The method to sweep.")
  flags.DEFINE_string("settings", "{}",
                      'JSON {"name": {config overrides}}; the method\'s defaults always run '
                      'too, as "default".')
  flags.DEFINE_list("tune_seeds", ["100", "101"], "Seeds of the tuning fits (not the table's).")
  flags.DEFINE_integer("num_test", 1000, "Held-out examples per ID set and seed.")
  flags.DEFINE_string("out_dir", "out/sweep", "Output directory.")
  flag_checks.writable_dir("out_dir")
  flag_checks.json_dicts("settings", example="'{\"lr3e-3\": {\"lr\": 3e-3}}'")


FLAGS = flags.FLAGS


def run_setting(method: str, overrides: dict, seeds, out_dir: str, num_test: int) -> dict:
  """Fits ``method`` with ``overrides`` on the tuning seeds; the tuning-split AUROCs."""
  config = methods.config_for(method, overrides)
  records = []
  for seed in seeds:
    for task in protocol.embedded_tasks(seed, num_test=num_test):
      records.append(ood.run_cell(method, config, task, seed, out_dir, split="tune"))
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
  return {"overrides": overrides, "auroc": float(np.mean(cells)),
          "auroc_se": float(np.std(cells) / np.sqrt(len(cells))), "num_cells": len(cells),
          "per_pair": {p: float(np.mean(v)) for p, v in pairs.items()},
          "by_score": {k: float(np.mean(v)) for k, v in by_score.items()},
          "fit_seconds": float(np.mean(fits)) if fits else None}


def to_markdown(method: str, results: dict, seeds) -> str:
  best_first = sorted(results, key=lambda n: -results[n]["auroc"])
  pairs = list(results[best_first[0]]["per_pair"])
  lines = [f"# Sweep of `{method}` on the tuning parts (seeds {', '.join(map(str, seeds))})", "",
           "Mean AUROC (×100) over (task, OOD set, seed) cells of the tuning split, which the "
           "table never evaluates.", "",
           "| setting | overrides | AUROC | other scores | fit s | "
           + " | ".join(p.split(":", 1)[1] + f" ({p.split(':')[0]})" for p in pairs) + " |",
           "|" + " --- |" * (5 + len(pairs))]
  for n in best_first:
    r = results[n]
    other = ", ".join(f"{k} {100 * v:.1f}" for k, v in r["by_score"].items()) or "–"
    fit = "–" if r["fit_seconds"] is None else f"{r['fit_seconds']:.0f}"
    lines.append(f"| {n} | `{json.dumps(r['overrides'])}` | {100 * r['auroc']:.1f} ± "
                 f"{100 * r['auroc_se']:.1f} | {other} | {fit} | "
                 + " | ".join(f"{100 * r['per_pair'].get(p, np.nan):.1f}" for p in pairs) + " |")
  return "\n".join(lines) + "\n"


def main(argv):
  del argv
  seeds = [int(s) for s in FLAGS.tune_seeds]
  settings = {"default": {}, **json.loads(FLAGS.settings)}
  path = os.path.join(FLAGS.out_dir, "sweep.json")
  results = {}
  if os.path.exists(path):
    with open(path) as f:
      results = {n: r for n, r in json.load(f)["results"].items()
                 if r["overrides"] == settings.get(n)}
  for name, overrides in settings.items():
    print(f"sweep {FLAGS.method}: {name} {json.dumps(overrides)}", file=sys.stderr, flush=True)
    results[name] = run_setting(FLAGS.method, overrides, seeds,
                                os.path.join(FLAGS.out_dir, name), FLAGS.num_test)
    print(f"sweep {FLAGS.method}: {name}: AUROC {100 * results[name]['auroc']:.1f}",
          file=sys.stderr, flush=True)
    train.write_json(path, {"method": FLAGS.method, "seeds": seeds, "results": results})
    with open(os.path.join(FLAGS.out_dir, "sweep.md"), "w") as f:
      f.write(to_markdown(FLAGS.method, results, seeds))


if __name__ == "__main__":
  define_flags()
  app.run(main)
