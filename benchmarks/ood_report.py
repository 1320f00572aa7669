"""The OOD benchmark's report: per-method aggregates over cells, paired comparisons, the
fidelity of CSD to the closed form it estimates, ``ood.md`` and the plots.

Every function reads cell records (``ood_cells.run_cell``) or the summary built from them; none
fits or scores anything.
"""

from __future__ import annotations

import os

import numpy as np
import scipy.stats

from benchmarks import ood_cells
from benchmarks import protocol
from uncertainty_kit import defaults
from uncertainty_kit import methods
from uncertainty_kit import metrics

METRIC_KEYS = ("auroc", "aupr_in", "aupr_out")


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
  """What a method's score computes, in words (the "Scores and classifiers" list of ood.md)."""
  if name == "ntkgp_exact":
    return (
        f"closed-form NTK-GP {config['score'].replace('_', ' ')} of CSD's label kernel "
        f"(ridge {config['ridge']:g} tr Σ_X; prior {config['prior']})"
    )
  if _kernel_variance(name) and config.get("towers") == "deep":
    return SCORE_DESCRIPTIONS[f"deep_{config['score']}"]
  if _kernel_variance(name):
    prior = {"init": "f at random init", "trained": "f = the trained classifier"}.get(
        config["prior"], config["prior"]
    )
    return SCORE_DESCRIPTIONS[config["score"]] + f" (prior {prior})"
  if name == "rnd":
    return SCORE_DESCRIPTIONS["rnd"]
  return {
      "variance": "predictive variance Σ_k Var p_k",
      "mutual_information": "mutual information (BALD)",
      "entropy": "predictive entropy",
      "max_prob": "1 − max prob",
      "logit_variance": "output variance Σ_k Var z_k",
      "relative_logit_variance": "relative output variance Σ_k Var z_k / Σ_k E z_k²",
  }[config["score"]]


def _classifier_description(name: str, config) -> str:
  """Where a method's accuracy comes from, in words."""
  if _kernel_variance(name) and config.get("towers") == "deep":
    return "separately trained classifier, same backbone and budget (not used by the score)"
  if _kernel_variance(name):
    prior = (
        "that trained classifier's last layer"
        if config.get("prior") == "trained"
        else "that backbone at random init"
    )
    return (
        "separately trained classifier, same backbone and budget (CSD's label kernel: " f"{prior})"
    )
  if name == "rnd":
    return "separately trained classifier, same backbone/budget"
  return {
      "ens3": "ensemble mean",
      "ens15": "ensemble mean",
      "mc_dropout": "MC-dropout mean",
      "laplace": "Laplace predictive mean (MAP = plain classifier)",
      "bnn_mcmc": "mean over the SGLD samples",
  }.get(name, "own")


def aggregate(records: list[dict], names: list[str], seeds: int) -> dict:
  """Per method (in ``names`` order): mean ± std of accuracy and of each metric over its
  (pair, seed) cells, fit seconds, its config and score descriptions, AUROC under its other
  scores; per (method, pair) the same metrics over seeds. Returns {"results", "per_pair",
  "pairs", "seeds"}."""
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
    entry["by_score"] = {
        config.get("score", "own"): {"auroc": entry["auroc"], "auroc_std": entry["auroc_std"]}
    }
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
    for towers in defaults.TOWER_FORMS:
      for name in (f"{base}_{towers}",) + ((base,) if towers == defaults.DEFAULT_TOWERS else ()):
        if name in results:
          forms[towers] = {
              k: results[name][k] for k in ("auroc", "auroc_std", "aupr_in", "aupr_out")
          }
    if forms:
      out[base] = {
          **forms,
          "default": defaults.DEFAULT_TOWERS,
          "seeds": {
              t: results[f"{base}_{t}"]["num_seeds"] for t in forms if f"{base}_{t}" in results
          },
      }
      if len(forms) == 2:
        out[base]["better_by_auroc"] = max(defaults.TOWER_FORMS, key=lambda t: forms[t]["auroc"])
  return out


def fidelity_to_exact(
    out_dir: str, configs: dict, cells: list[tuple[str, int]], split: str = "eval"
) -> dict:
  """How closely each CSD row tracks ``ntkgp_exact`` (the closed form it estimates) on the very
  inputs both scored: Spearman ρ and median |Δ score| over every evaluated input, mean over the
  (task, seed) cells where both ran. Only rows with the same prior and score as
  ``ntkgp_exact`` (else they estimate another kernel's variance)."""
  out = {}
  exact = configs.get("ntkgp_exact")
  for name, config in configs.items():
    if (
        not name.startswith("csd")
        or exact is None
        or any(config[k] != exact[k] for k in ("prior", "score", "backbone"))
    ):
      continue
    rhos, gaps = [], []
    for task, seed in cells:
      paths = [
          os.path.join(out_dir, "cells", n, f"{ood_cells.cell_id(task, seed, split)}.npz")
          for n in (name, "ntkgp_exact")
      ]
      if not all(os.path.exists(p) for p in paths):
        continue
      with np.load(paths[0]) as a, np.load(paths[1]) as b:
        sa = np.concatenate([a[k] for k in sorted(a.files)])
        sb = np.concatenate([b[k] for k in sorted(a.files)])
      rhos.append(float(scipy.stats.spearmanr(sa, sb)[0]))
      gaps.append(float(np.median(np.abs(sa - sb))))
    if rhos:
      out[name] = {
          "spearman": float(np.mean(rhos)),
          "median_abs_diff": float(np.mean(gaps)),
          "cells": len(rhos),
      }
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
    out[name] = {
        "raw": r["by_score"][kinds[0]],
        "relative": r["by_score"][kinds[1]],
        "kinds": list(kinds),
        "default_score": r["hparams"]["score"],
        "default": {"auroc": r["auroc"], "auroc_std": r["auroc_std"]},
    }
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
  mean is ≥ 0 (``holds``: the first method is at least as good) and more than two standard
  errors away from 0 (``resolved``)."""
  common = sorted(set(a) & set(b))
  if not common:
    return None
  d = np.array([a[k] - b[k] for k in common])
  sem = float(d.std(ddof=1) / np.sqrt(len(d))) if len(d) > 1 else float("nan")
  return {
      "holds": bool(d.mean() >= 0),
      "diff": float(d.mean()),
      "sem": sem,
      "cells": len(d),
      "resolved": bool(abs(d.mean()) > 2 * sem) if np.isfinite(sem) else False,
  }


def comparisons(records: list[dict], same: dict | None = None) -> dict:
  """The headline comparisons as paired AUROC differences over the (task, seed, pair) cells
  both methods ran (None where a method is missing): CSD against ENS(15) and the closed form of
  the last-layer kernel, and what each kind of context adds.

  ``csd_auroc_ge_ens15_same_functional``: both scored by the relative output variance
  (``same_functional``), CSD's own quantity."""
  names = {r["method"] for r in records}
  ge = (
      lambda a, b: _paired(_cell_aurocs(records, a), _cell_aurocs(records, b))
      if a in names and b in names
      else None
  )
  out = {
      "csd_auroc_ge_ens15": ge("csd", "ens15"),
      "csd_auroc_ge_ntkgp_exact": ge("csd", "ntkgp_exact"),
      "csd_aug_ge_csd": ge("csd_aug", "csd"),
      "csd_aug_no_overlap_ge_csd": ge("csd_aug_no_overlap", "csd"),
      "csd_ood_ge_csd_aug": ge("csd_ood", "csd_aug"),
      "csd_ood_ge_csd": ge("csd_ood", "csd"),
      "csd_aug_ge_ens15": ge("csd_aug", "ens15"),
      "csd_ood_ge_ens15": ge("csd_ood", "ens15"),
  }
  if same and "csd" in same and "ens15" in same:
    out["csd_auroc_ge_ens15_same_functional"] = _paired(
        _cell_aurocs(records, "csd", same["csd"]["kinds"][1]),
        _cell_aurocs(records, "ens15", same["ens15"]["kinds"][1]),
    )
  return out


def write_markdown(path: str, summary: dict) -> None:
  """``ood.md``: the table, AUROC per pair, scores, tower forms, output-variance scores, paired
  comparisons and CSD's fidelity to the closed form, each where the summary has it."""
  res = summary["results"]
  lines = [
      f"# OOD detection ({summary['dataset']}, {summary['seeds']} seeds, "
      f"{len(summary['pairs'])} ID/OOD pairs)",
      "",
      "Mean ± std over all (pair, seed) cells; accuracy over seeds, on the ID test set. Fit s: "
      "seconds per (task, seed) fit, compilation included; a network shared with a method that "
      "ran earlier (the plain classifier; ENS(3)'s members, ENS(15)'s first three) counts at the "
      "seconds it took to train.",
      "",
      "| method | acc | AUROC | AUPR-IN | AUPR-OUT | fit s |",
      "|---|---|---|---|---|---|",
  ]
  for name, r in res.items():
    fit = f"{r['fit_seconds']:.1f}" if r["fit_seconds"] is not None else "–"
    lines.append(
        f"| {name} | {100 * r['acc']:.1f} ± {100 * r['acc_std']:.1f} | "
        + " | ".join(f"{100 * r[k]:.1f} ± {100 * r[k + '_std']:.1f}" for k in METRIC_KEYS)
        + f" | {fit} |"
    )
  lines += [
      "",
      "## AUROC per pair",
      "",
      "| method | " + " | ".join(p.split(":", 1)[1] for p in summary["pairs"]) + " |",
      "|---|" + "---|" * len(summary["pairs"]),
  ]
  for name in res:
    pp = summary["per_pair"][name]
    lines.append(
        f"| {name} | "
        + " | ".join(f"{100 * pp[p]['auroc']:.1f}" if p in pp else "–" for p in summary["pairs"])
        + " |"
    )
  lines += ["", "## Scores and classifiers", ""]
  for name, r in res.items():
    lines.append(f"- **{name}**: score = {r['score']}; accuracy from {r['classifier']}.")
  if summary.get("tower_comparison"):
    lines += [
        "",
        "## CSD tower forms (AUROC)",
        "",
        "| variant | deep | matched | default |",
        "|---|---|---|---|",
    ]
    for base, t in summary["tower_comparison"].items():
      cell = (
          lambda f: f"{100 * t[f]['auroc']:.1f} ± {100 * t[f]['auroc_std']:.1f}" if f in t else "–"
      )
      lines.append(f"| {base} | {cell('deep')} | {cell('matched')} | {t['default']} |")
  if summary.get("same_functional"):
    lines += [
        "",
        "## Every method scored by the variance of its output (what CSD estimates)",
        "",
        "AUROC with the score replaced by the variance of the network output (logits) "
        "across members / passes / posterior samples, raw and relative (over the outputs' "
        "mean second moment; for CSD and ntkgp_exact V(x)/Θ_L(x,x)); same fitted states.",
        "",
        "| method | own score | AUROC (own) | output variance | relative output " "variance |",
        "|---|---|---|---|---|",
    ]
    for name, f in summary["same_functional"].items():
      pct = lambda a: f"{100 * a['auroc']:.1f} ± {100 * a['auroc_std']:.1f}"
      lines.append(
          f"| {name} | {f['default_score']} | {pct(f['default'])} | {pct(f['raw'])} | "
          f"{pct(f['relative'])} |"
      )
  if any(summary.get("comparisons", {}).values()):
    lines += [
        "",
        "## Paired comparisons (AUROC differences over the cells both ran)",
        "",
        "| comparison | Δ AUROC | ± s.e. | cells | first ≥ second | beyond 2 s.e. |",
        "|---|---|---|---|---|---|",
    ]
    for comparison, a in summary["comparisons"].items():
      if a is not None:
        lines.append(
            f"| {comparison} | {100 * a['diff']:+.2f} | {100 * a['sem']:.2f} | {a['cells']} | "
            f"{'yes' if a['holds'] else 'no'} | {'yes' if a['resolved'] else 'no'} |"
        )
  if summary.get("csd_vs_exact"):
    lines += [
        "",
        "## CSD vs the closed form it estimates (ntkgp_exact, same inputs)",
        "",
        "| method | Spearman ρ | median abs diff | cells |",
        "|---|---|---|---|",
    ]
    for name, f in summary["csd_vs_exact"].items():
      lines.append(
          f"| {name} | {f['spearman']:.3f} | {f['median_abs_diff']:.2e} | " f"{f['cells']} |"
      )
  with open(path, "w") as f:
    f.write("\n".join(lines) + "\n")


def write_plots(out_dir: str, summary: dict, names: list[str], task: str, seed: int) -> list:
  """ROC curves and score histograms of one (task, seed) cell per method, and AUROC by method;
  returns the PNG file names written in ``out_dir``."""
  plt = protocol.setup_matplotlib()
  written = []
  loaded = {}
  for name in names:
    p = os.path.join(out_dir, "cells", name, f"{ood_cells.cell_id(task, seed)}.npz")
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
      ax.plot(
          fpr,
          tpr,
          lw=1.2,
          label=f"{ood} ({metrics.ood_metrics(sc['__id__'], sc[ood])['auroc']:.2f})",
      )
    ax.plot([0, 1], [0, 1], "k:", lw=0.8)
    ax.set_title(name)
    ax.set_xlabel("FPR")
    ax.set_ylabel("TPR")
    ax.legend(fontsize=6, loc="lower right")
  for ax in list(axes.flat)[len(loaded) :]:
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
  for ax in list(axes.flat)[len(loaded) :]:
    ax.axis("off")
  fig.tight_layout()
  fig.savefig(os.path.join(out_dir, "score_histograms.png"), dpi=110)
  plt.close(fig)
  written.append("score_histograms.png")
  # AUROC by method.
  res = summary["results"]
  fig, ax = plt.subplots(figsize=(max(6, 0.8 * len(res)), 3.8))
  xs = np.arange(len(res))
  ax.bar(
      xs,
      [res[n]["auroc"] for n in res],
      yerr=[res[n]["auroc_std"] for n in res],
      color=["C3" if n.startswith("csd") else "C0" for n in res],
      capsize=3,
  )
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
