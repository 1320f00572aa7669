r"""A real deep ensemble against the closed-form NTK-GP variance it converges to.

    python -m validation.ensemble --out_dir=DIR [--config=configs/ensemble.py:quick]

Ensemble (He, Lakshminarayanan & Teh 2020, "Bayesian Deep Ensembles via the Neural Tangent
Kernel", NTKGP-param): M members, each an independently initialised MLP h(·, θ) in NTK
parameterisation plus a fixed random additive function

    f(x) = h(x, θ) + δ(x),   δ(x) = J_{θ≤L}(x; θ₀) θ*,   θ* ~ N(0, I),

the jvp of the member's own net at its init θ₀ along a random tangent θ* that is zero on the
readout layer. At init f has covariance K + (Θ − K) = Θ: the readout layer's share of the NTK is
the NNGP kernel K, which h(·, θ₀) already carries, and δ adds the rest. Trained by full-batch
gradient descent (loss ½Σ(f(xᵢ) − yᵢ)², lr = 1/λ_max(Θ(X, X))), the ensemble's variance tends,
as width → ∞ and training converges, to the NTK-GP posterior variance

    V(x) = Θ(x,x) − Θ(x,X) Θ(X,X)⁻¹ Θ(X,x)

of the **infinite-width** NTK Θ of the spec (``ntk.infinite_kernels``). That is the closed form
used here: each member has its own init, so no single empirical NTK is the ensemble's kernel;
the infinite-width kernel is the one their distribution converges to. (The alternative form,
a centred net h(x,θ) − h(x,θ₀) plus the full jvp J(x; θ₀')θ'' of an independent init, has the
same limit; ``prior_form="centred"`` runs it too, as a cross-check.)

Members are trained together with ``jax.vmap`` (in chunks, to bound memory); the toy is
``problems.toy_1d`` (1-D inputs in two clusters through a fixed random Fourier embedding, see
there). ``rel_err`` = ‖v_ens − v_cf‖₂/‖v_cf‖₂ over a grid of queries on [−6, 6]; the Monte Carlo
floor of a sample variance from M Gaussian draws is sqrt(2/(M − 1)) (its relative standard
deviation, at every query), so ``rel_err_by_members`` should follow it. ``gd_truncation_rel_err``
is how far the linearised dynamics after the same number of steps still are from t = ∞.

Finite width leaves one more term: each member's kernel Θ̂ᵢ differs from Θ by O(1/sqrt(n)),
so its trained mean Θ̂ᵢ(x,X)Θ̂ᵢ⁻¹y differs from member to member, and that spread adds to the
ensemble's variance on top of the NTK-GP variance (it vanishes as n → ∞, and scales with ‖y‖²).
``zero_targets`` trains the same ensemble on y ≡ 0, where the term is absent, to separate it
from the Monte Carlo error; ``excess_over_mc_floor`` = sqrt(rel_err² − 2/(M − 1)).

The plot also shows CSD (``fitting.fit`` on the same toy and prior spec): with exact-NTK labels
(free towers; it targets this same V up to Θ̂ ≈ Θ) and with the default last-layer labels
(matched form; it targets the posterior of the last-layer kernel Θ_L, a different, smaller
variance: the cost of the last-layer approximation).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from csd_jax import csd
from csd_jax import fitting
from csd_jax import models
from csd_jax import ntk
from csd_jax import posterior
from cmdline import cli
from validation import agreement
from validation import plots
from validation import problems
from validation import runner

NAME = "ensemble"


def _closed_forms(spec, x, xq, y, lr: float, num_steps: int) -> dict:
  """Closed-form mean/variance (t = ∞) and the linearised GD variance after num_steps."""

  k_xx = np.asarray(ntk.infinite_kernels(spec, x, None, ("ntk",)).ntk)
  k_qx = np.asarray(ntk.infinite_kernels(spec, xq, x, ("ntk",)).ntk)
  k_qq = np.asarray(ntk.infinite_kernels(spec, xq, None, ("ntk",)).ntk)
  prior = np.diag(k_qq)
  v = np.asarray(posterior.ntkgp_variance(jnp.asarray(k_xx), jnp.asarray(k_qx), jnp.asarray(prior)))
  mean = k_qx @ np.linalg.solve(k_xx, y)
  # f_t = f₀ + A_t (y − f₀(X)), A_t = Θ(x,X) Θ⁻¹ (I − (I − ηΘ)^t), f₀ ~ GP(0, Θ):
  # Var f_t(x) = Θ(x,x) − 2 A_t Θ(X,x) + A_t Θ(X,X) A_tᵀ.
  ev, u = np.linalg.eigh(k_xx)
  a = k_qx @ u @ np.diag((1.0 - (1.0 - lr * ev) ** num_steps) / ev) @ u.T
  v_t = prior - 2.0 * np.sum(a * k_qx, axis=1) + np.sum((a @ k_xx) * a, axis=1)
  return {
      "k_xx": k_xx,
      "prior": prior,
      "variance": v,
      "mean": mean,
      "variance_t": v_t,
      "mean_t": a @ y,
      "lambda_max": float(ev[-1]),
      "kappa": float(ev[-1] / ev[0]),
  }


def _tangent(key, params0, readout: bool):
  """θ* ~ N(0, I) shaped like params0; zero on the readout ("head") unless ``readout``."""

  leaves, treedef = jax.tree_util.tree_flatten_with_path(params0)
  keys = jax.random.split(key, len(leaves))
  out = []
  for k, (path, leaf) in zip(keys, leaves):
    is_head = any(getattr(p, "key", None) == "head" for p in path)
    out.append(
        jnp.zeros_like(leaf)
        if (is_head and not readout)
        else jax.random.normal(k, leaf.shape, leaf.dtype)
    )
  return jax.tree_util.tree_unflatten(treedef, out)


def make_train_chunk(net, num_steps: int, prior_form: str):
  """A jitted ``(keys (C, 2), x, y, xq, lr) -> (f(xq) (C, Q), train residual (C,))``."""

  def h(p, x):
    return net.apply(p, x)[:, 0]

  def member(key, x, y, xq, lr):
    k_init, k_prior_init, k_tan = jax.random.split(key, 3)
    params0 = net.init(k_init, x[:1])
    if prior_form == "he2020":  # f = h(x, θ) + J_{θ≤L}(x; θ₀) θ*
      tangent = _tangent(k_tan, params0, readout=False)
      delta = lambda z: jax.jvp(lambda p: h(p, z), (params0,), (tangent,))[1]
      offset = lambda z: 0.0
    else:  # centred: f = h(x, θ) − h(x, θ₀) + J(x; θ₀') θ'', θ₀' independent
      params_prior = net.init(k_prior_init, x[:1])
      tangent = _tangent(k_tan, params_prior, readout=True)
      delta = lambda z: jax.jvp(lambda p: h(p, z), (params_prior,), (tangent,))[1]
      offset = lambda z: -h(params0, z)
    d_x, d_q = delta(x), delta(xq)
    o_x, o_q = offset(x), offset(xq)

    def loss(p):
      r = h(p, x) + o_x + d_x - y
      return 0.5 * jnp.sum(r * r)

    grad = jax.grad(loss)

    def step(_, p):
      g = grad(p)
      return jax.tree_util.tree_map(lambda a, b: a - lr * b, p, g)

    params = jax.lax.fori_loop(0, num_steps, step, params0)
    f_x = h(params, x) + o_x + d_x
    scale = jnp.where(jnp.linalg.norm(y) > 0, jnp.linalg.norm(y), 1.0)  # absolute if y ≡ 0
    return h(params, xq) + o_q + d_q, jnp.linalg.norm(f_x - y) / scale

  return jax.jit(jax.vmap(member, in_axes=(0, None, None, None, None)))


def train_ensemble(
    spec,
    toy,
    num_members: int,
    num_steps: int,
    lr: float,
    seed: int,
    prior_form: str = "he2020",
    chunk: int = 128,
) -> tuple[np.ndarray, float]:
  """(f(x_query) for every member (M, Q), max relative train residual)."""

  net = models.module(spec)
  fn = make_train_chunk(net, num_steps, prior_form)
  x, y, xq = (jnp.asarray(toy[k]) for k in ("x_train", "y_train", "x_query"))
  keys = jax.random.split(
      jax.random.PRNGKey(seed + (0 if prior_form == "he2020" else 999)), num_members
  )
  outs, res = [], []
  chunk = min(chunk, num_members)
  for i in range(0, num_members, chunk):
    f_q, r = fn(keys[i : i + chunk], x, y, xq, lr)
    outs.append(np.asarray(f_q))
    res.append(float(jnp.max(r)))
    runner.log(
        NAME,
        f"{prior_form}: trained members {i + chunk}/{num_members} "
        f"(train residual {res[-1]:.1e})",
    )
  return np.concatenate(outs), max(res)


def by_members(f_q: np.ndarray, v_cf: np.ndarray, sizes) -> list[dict]:
  """rel_err of the sample variance of disjoint groups of each size, averaged over groups."""
  out = []
  for m in sizes:
    groups = f_q.shape[0] // m
    errs = [
        agreement.rel_err(np.var(f_q[g * m : (g + 1) * m], axis=0, ddof=1), v_cf)
        for g in range(groups)
    ]
    out.append(
        {
            "members": m,
            "rel_err": float(np.mean(errs)),
            "rel_err_std": float(np.std(errs)),
            "groups": groups,
            "mc_floor": math.sqrt(2.0 / (m - 1)),
        }
    )
  return out


def run_csd(spec, toy, config: ml_collections.ConfigDict, cf_inf: dict) -> dict:
  """CSD on the same toy: last-layer (matched) and exact-NTK labels (free towers)."""
  seed = config.seed
  x, xq = jnp.asarray(toy["x_train"]), jnp.asarray(toy["x_query"])
  n = x.shape[0]
  towers = models.MLPSpec(widths=(config.csd_tower_width,) * 2, b_std=0.1)
  variants = {
      "last_layer": (csd.CSD(prior=spec), config.csd_last_layer_steps, n),
      "ntk": (
          csd.CSD(prior=spec, feature_net=towers, context_net=towers, label_kernel="ntk"),
          config.csd_ntk_steps,
          n,
      ),
  }
  out = {}
  for name, (model, steps, bs) in variants.items():
    state = csd.init(model, jax.random.PRNGKey(seed + 11), x)
    state, hist = fitting.fit(
        model,
        state,
        jax.random.PRNGKey(seed + 12),
        x,
        num_steps=steps,
        batch_size=bs,
        log_every=max(steps // 4, 1),
        verbose=False,
    )
    v, _ = csd.variance(model, state, xq)
    v = np.asarray(v)
    if name == "last_layer":
      own_kernel = "last-layer Θ_L"
      k_xx = ntk.last_layer_ntk(spec, state.prior_params, x)
      k_qx = ntk.last_layer_ntk(spec, state.prior_params, xq, x)
    else:
      own_kernel = "empirical Θ̂ of the prior"
      apply = csd.prior_apply(model)
      k_xx = ntk.empirical_ntk(apply, state.prior_params, x)
      k_qx = ntk.empirical_ntk(apply, state.prior_params, xq, x)
    prior = np.asarray(csd.prior_variance(model, state.prior_params, xq))
    v_own = np.asarray(posterior.ntkgp_variance(k_xx, k_qx, jnp.asarray(prior), 1e-10))
    out[name] = {
        "variance": v,
        "steps": steps,
        "final_loss": hist["loss"][-1],
        "rel_err_vs_own_closed_form": agreement.rel_err(v, v_own),
        "own_closed_form": own_kernel,
        "rel_err_vs_infinite_ntk_closed_form": agreement.rel_err(v, cf_inf["variance"]),
        "own_closed_form_rel_err_vs_infinite_ntk": agreement.rel_err(v_own, cf_inf["variance"]),
        **{f"{k}_vs_own": val for k, val in agreement.agreement(v, v_own, prior).items()},
    }
    runner.log(
        NAME,
        f"CSD ({name} labels, {steps} steps): rel err vs own closed form "
        f"{out[name]['rel_err_vs_own_closed_form']:.3f}, vs infinite-NTK closed form "
        f"{out[name]['rel_err_vs_infinite_ntk_closed_form']:.3f}",
    )
  return out


def check_config(config: ml_collections.ConfigDict) -> None:
  """Raises ``cli.ConfigError`` naming the first field out of range."""
  cli.check(
      config,
      non_negative=("seed",),
      positive=(
          "width",
          "num_steps",
          "chunk",
          "csd_tower_width",
          "csd_last_layer_steps",
          "csd_ntk_steps",
      ),
  )
  for path in ("members", "centred_members", "zero_target_members"):
    if not config[path] >= 2:
      raise cli.ConfigError(
          f"--config.{path} must be >= 2 (a sample variance), " f"got {config[path]!r}"
      )


def closed_form_at_gd_rate(spec, toy: dict, num_steps: int) -> tuple[dict, float]:
  """The closed forms (``_closed_forms``) at lr = 1/λ_max(Θ(X, X)), the largest stable GD rate,
  and that lr."""
  cf = _closed_forms(spec, toy["x_train"], toy["x_query"], toy["y_train"], 1.0, 0)
  lr = 1.0 / cf["lambda_max"]
  cf = _closed_forms(spec, toy["x_train"], toy["x_query"], toy["y_train"], lr, num_steps)
  runner.log(
      NAME,
      f"closed form: κ(Θ(X,X)) {cf['kappa']:.1e}, lr {lr:.3e}, GD truncation "
      f"after {num_steps} steps {agreement.rel_err(cf['variance_t'], cf['variance']):.1e}",
  )
  return cf, lr


def member_sizes(num_members: int) -> list[int]:
  """The group sizes M of ``rel_err_by_members``: powers of two from 16 up to the ensemble."""
  return [m for m in (16, 32, 64, 128, 256, 512, 1024) if m <= num_members]


def log_rows(rows: list[dict]) -> None:
  for r in rows:
    runner.log(
        NAME,
        f"M = {r['members']:4d}: rel err {r['rel_err']:.4f} ± {r['rel_err_std']:.4f}"
        f" (MC floor {r['mc_floor']:.4f}, {r['groups']} groups)",
    )


def _row_fields(rows: list[dict]) -> list[dict]:
  return [{k: r[k] for k in ("members", "rel_err", "rel_err_std", "mc_floor")} for r in rows]


def run_extras(
    spec, toy: dict, config: ml_collections.ConfigDict, cf: dict, lr: float, sizes: list[int]
) -> tuple[dict, dict]:
  """The cross-checks of ``config.extras``: the centred prior form, the ensemble trained on
  y ≡ 0, and CSD on the same toy. Returns (their results, ``run_csd``'s output)."""
  seed, num_steps = config.seed, config.num_steps
  m_centred = config.centred_members
  f_c, _ = train_ensemble(
      spec, toy, m_centred, num_steps, lr, seed, prior_form="centred", chunk=config.chunk
  )
  v_centred = np.var(f_c, axis=0, ddof=1)
  # Diagnostic: the same ensemble trained on y ≡ 0. The NTK-GP variance does not depend on y,
  # but at finite width each member's kernel Θ̂ᵢ differs, so its posterior mean
  # Θ̂ᵢ(x,X)Θ̂ᵢ⁻¹y differs, and that spread adds to the ensemble's variance. With y ≡ 0 it is
  # gone, and what remains is Monte Carlo error.
  m_zero = config.zero_target_members
  f_z, _ = train_ensemble(
      spec,
      dict(toy, y_train=np.zeros_like(toy["y_train"])),
      m_zero,
      num_steps,
      lr,
      seed + 1,
      chunk=config.chunk,
  )
  v_zero = np.var(f_z, axis=0, ddof=1)
  runner.log(
      NAME,
      f"zero targets, M = {m_zero}: rel err "
      f"{agreement.rel_err(v_zero, cf['variance']):.4f} "
      f"(MC floor {math.sqrt(2.0 / (m_zero - 1)):.4f})",
  )
  csd_out = run_csd(spec, toy, config, cf)
  extra_results = {
      "centred_prior_form": {
          "members": m_centred,
          "rel_err": agreement.rel_err(v_centred, cf["variance"]),
          "mc_floor": math.sqrt(2.0 / (m_centred - 1)),
      },
      "zero_targets": {
          "members": m_zero,
          "rel_err": agreement.rel_err(v_zero, cf["variance"]),
          "mc_floor": math.sqrt(2.0 / (m_zero - 1)),
          "rel_err_by_members": _row_fields(
              by_members(f_z, cf["variance"], [m for m in sizes if m <= m_zero])
          ),
          "note": "y ≡ 0: removes the spread of the members' posterior means "
          "Θ̂ᵢ(x,X)Θ̂ᵢ⁻¹y (finite-width kernel fluctuations), which the "
          "infinite-width closed form does not have",
      },
      "csd": {k: {kk: vv for kk, vv in v.items() if kk != "variance"} for k, v in csd_out.items()},
  }
  return extra_results, csd_out


def ensemble_result(
    config: ml_collections.ConfigDict,
    f_q: np.ndarray,
    residual: float,
    cf: dict,
    lr: float,
    rows: list[dict],
    extra_results: dict,
) -> dict:
  """ensemble.json's content: the ensemble's members' outputs ``f_q`` (M, Q) against the
  closed forms ``cf``, by group size (``rows``), with the extras' results and the setup."""
  width, num_members = config.width, config.members
  v_ens = np.var(f_q, axis=0, ddof=1)
  rel = agreement.rel_err(v_ens, cf["variance"])
  return {
      "rel_err": rel,
      "members": num_members,
      "width": width,
      "mc_floor": math.sqrt(2.0 / (num_members - 1)),
      "rel_err_by_members": _row_fields(rows),
      "rel_err_by_members_loglog_slope": agreement.loglog_slope(
          [r["members"] for r in rows], [r["rel_err"] for r in rows]
      ),
      "mean_rel_err": agreement.rel_err(f_q.mean(axis=0), cf["mean"]),
      # Against the linearised mean after the same number of steps (the fit is early-stopped:
      # κ(Θ(X,X)) ~ 6e3 leaves small-eigenvalue directions of y unfitted).
      "mean_rel_err_vs_linearised_at_num_steps": agreement.rel_err(f_q.mean(axis=0), cf["mean_t"]),
      "rel_err_vs_linearised_at_num_steps": agreement.rel_err(v_ens, cf["variance_t"]),
      "gd_truncation_rel_err": agreement.rel_err(cf["variance_t"], cf["variance"]),
      "max_train_residual": residual,
      "excess_over_mc_floor": math.sqrt(max(rel**2 - 2.0 / (num_members - 1), 0.0)),
      **extra_results,
      "closed_form": "NTK-GP variance with the infinite-width NTK of the spec "
      "(ntk.infinite_kernels), diag_reg 0",
      "setup": {
          "spec": f"MLPSpec(widths=({width}, {width}), b_std=0.1), NTK parameterisation",
          "prior_form": "he2020: f = h(x,θ) + J_{θ≤L}(x;θ₀)θ*",
          "num_steps": config.num_steps,
          "learning_rate": lr,
          "kappa": cf["kappa"],
          "toy": "problems.toy_1d: 20 points, clusters at -2 and 1.5 (std 0.4), y = sin 2t, "
          "Fourier embedding dim 32, length scale 1; 241 queries on [-6, 6]",
      },
      "targets": {"rel_err": 0.10, "members_at_least": 256},
      "config": config,
  }


def run(config: ml_collections.ConfigDict, out_dir: str) -> dict:
  """The ensemble of ``config`` (``configs/ensemble.py``) against the closed form; writes
  ensemble.json and ensemble.png."""
  check_config(config)
  runner.enable_x64()
  spec = models.MLPSpec(widths=(config.width, config.width), b_std=0.1)
  toy = problems.toy_1d(config.seed)
  cf, lr = closed_form_at_gd_rate(spec, toy, config.num_steps)
  f_q, residual = train_ensemble(
      spec, toy, config.members, config.num_steps, lr, config.seed, chunk=config.chunk
  )
  sizes = member_sizes(config.members)
  rows = by_members(f_q, cf["variance"], sizes)
  log_rows(rows)
  extra_results, csd_out = (
      run_extras(spec, toy, config, cf, lr, sizes) if config.extras else ({}, {})
  )
  result = ensemble_result(config, f_q, residual, cf, lr, rows, extra_results)
  runner.write_json(out_dir, NAME, result)
  plot(out_dir, toy, cf, f_q, csd_out, rows, result)
  runner.log(
      NAME,
      f"rel err {result['rel_err']:.4f} with M={config.members} (floor "
      f"{result['mc_floor']:.4f}); wrote {out_dir}/{NAME}.json",
  )
  return result


def plot(
    out_dir: str,
    toy: dict,
    cf: dict,
    f_q: np.ndarray,
    csd_out: dict,
    rows: list[dict],
    result: dict,
) -> None:
  """ensemble.png: the ±2σ bands (closed form, ensemble, CSD), the variances over the queries,
  and rel err against M with the Monte Carlo floor."""
  t, tq = toy["t_train"], toy["t_query"]
  v_ens = np.var(f_q, axis=0, ddof=1)
  fig, axes = plots.figure(1, 3, size=(5.5, 4.0))
  ax = axes[0, 0]
  sd = np.sqrt(cf["variance"])
  ax.fill_between(
      tq,
      cf["mean"] - 2 * sd,
      cf["mean"] + 2 * sd,
      color="C0",
      alpha=0.25,
      label="closed form ±2σ (infinite NTK)",
  )
  m_ens, sd_ens = f_q.mean(axis=0), np.sqrt(v_ens)
  ax.plot(tq, m_ens, "C1", lw=1)
  ax.plot(tq, m_ens - 2 * sd_ens, "C1--", lw=1, label=f"ensemble ±2σ (M={result['members']})")
  ax.plot(tq, m_ens + 2 * sd_ens, "C1--", lw=1)
  for name, c in (("ntk", "C2"), ("last_layer", "C3")):
    if name not in csd_out:
      continue
    sd_c = np.sqrt(csd_out[name]["variance"])
    ax.plot(
        tq,
        cf["mean"] + 2 * sd_c,
        c,
        ls=":",
        lw=1.2,
        label=f"CSD ({name} labels) ±2σ about the closed-form mean",
    )
    ax.plot(tq, cf["mean"] - 2 * sd_c, c, ls=":", lw=1.2)
  ax.plot(t, toy["y_train"], "k.", ms=6, label="data")
  ax.set_xlabel("t")
  ax.set_ylim(-5, 5)
  ax.legend(fontsize=7, loc="lower left")
  ax.set_title(
      f"width {result['width']}: rel err {result['rel_err']:.3f} "
      f"(MC floor {result['mc_floor']:.3f})"
  )
  ax = axes[0, 1]
  ax.plot(tq, cf["variance"], "C0", label="closed form V")
  ax.plot(tq, v_ens, "C1--", label="ensemble variance")
  if csd_out:
    ax.plot(tq, csd_out["ntk"]["variance"], "C2:", label="CSD, exact-NTK labels")
    ax.plot(tq, csd_out["last_layer"]["variance"], "C3:", label="CSD, last-layer labels")
  ax.plot(tq, cf["prior"], "k", lw=0.5, label="prior Θ(x,x)")
  ax.plot(t, np.zeros_like(t), "k|", ms=10)
  ax.set_xlabel("t")
  ax.legend(fontsize=7)
  ax.set_title("variance")
  ax = axes[0, 2]
  ms = [r["members"] for r in rows]
  ax.loglog(ms, [r["rel_err"] for r in rows], "o-", label="ensemble rel err")
  if "zero_targets" in result:
    zr = result["zero_targets"]["rel_err_by_members"]
    ax.loglog(
        [r["members"] for r in zr], [r["rel_err"] for r in zr], "s-", label="same, trained on y ≡ 0"
    )
  ax.loglog(ms, [r["mc_floor"] for r in rows], "k--", label="MC floor sqrt(2/(M−1))")
  ax.set_xlabel("members M")
  ax.set_ylabel("‖v_ens − v_cf‖ / ‖v_cf‖")
  ax.legend(fontsize=8)
  plots.save_figure(fig, out_dir, NAME)


if __name__ == "__main__":
  runner.main(NAME, run, check_config)
