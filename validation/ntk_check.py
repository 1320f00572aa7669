r"""Checks the kernels of csd_jax.ntk against independent references.

    python -m validation.ntk_check --out_dir=DIR [--config=configs/ntk_check.py:quick]

Three checks, all float64:

1. ``empirical_vs_jacobian_max_rel_err``: ``ntk.empirical_ntk`` (neural-tangents, both
   implementations), ``ntk.jacobian_ntk`` and the factorised MLP kernel
   ``factorised_ntk.mlp_empirical_ntk`` against an explicit Jacobian product written here
   (``jax.jacrev`` of the flattened parameter vector, J(x1) J(x2)ᵀ / out_dim), over MLPs (ReLU /
   erf, NTK / standard parameterisation, one and three outputs) and a CNN.
2. ``infinite_vs_closed_form_max_rel_err``: neural-tangents' infinite-width NTK of ReLU MLPs
   (``ntk.infinite_kernels``) against the arc-cosine recursion (Cho & Saul 2009; Jacot et al.
   2018; Arora et al. 2019) written here for the NTK parameterisation of ``MLPSpec``:

       K¹(x,x') = σ_w² x·x'/d + σ_b²,                    Θ¹ = K¹,
       θ = arccos(K₁₂ / sqrt(K₁₁K₂₂)),
       K^{l+1} = σ_w² sqrt(K₁₁K₂₂)/(2π) (sin θ + (π − θ) cos θ) + σ_b²,
       Θ^{l+1} = K^{l+1} + σ_w² (π − θ)/(2π) Θ^l,

   with Θ at the head the NTK and K the NNGP kernel. Also the erf recursion (Williams 1997) as
   an extra: E[erf u erf v] = 2/π arcsin(2K₁₂/sqrt((1+2K₁₁)(1+2K₂₂))),
   E[erf' u erf' v] = 4/π / sqrt((1+2K₁₁)(1+2K₂₂) − 4K₁₂²).
   Errors are max |a − b| / max |b| (``agreement.max_rel_err``).
3. ``width_sweep``: ‖Θ̂ − Θ‖_F / ‖Θ‖_F of the empirical NTK of a 2-hidden-layer ReLU MLP at
   random init against the infinite-width NTK, root-mean-square over seeds, by width; expected
   ∝ 1/sqrt(width) (the fluctuations of Θ̂ at init are O(1/sqrt(n))).

Targets: both max rel errs ≤ 1e-10; width-sweep log-log slope ≈ −0.5.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from jax.flatten_util import ravel_pytree

from csd_jax import models
from csd_jax import ntk
from cmdline import cli
from validation import agreement
from validation import factorised_ntk
from validation import plots
from validation import problems
from validation import runner

NAME = "ntk_check"
# The nets whose empirical NTK is checked against the explicit Jacobian product.
EMPIRICAL_SPECS = {
    "mlp_relu_ntk": models.MLPSpec(widths=(48, 48)),
    "mlp_relu_ntk_3out": models.MLPSpec(widths=(32, 32), out_dim=3),
    "mlp_erf_standard": models.MLPSpec(
        widths=(40,), activation="erf", parameterization="standard", b_std=0.5
    ),
    "mlp_relu_nobias": models.MLPSpec(widths=(32, 32, 32), b_std=None),
    "cnn": models.CNNSpec(convs=((4, 3, 1), (4, 3, 2)), widths=(16,), out_dim=2),
}


# ----------------------------------------------------------------------------------------------
# Independent references.
# ----------------------------------------------------------------------------------------------


def reference_jacobian_ntk(apply_fn, params, x1, x2):
  """J(x1) J(x2)ᵀ / out_dim with J = jax.jacrev of the flattened parameter vector: x1 (N1, ...),
  x2 (N2, ...) -> (N1, N2)."""

  flat, unravel = ravel_pytree(params)

  def jac(x):
    j = jax.jacrev(lambda p: apply_fn(unravel(p), x))(flat)  # (N, out, P)
    return j

  j1, j2 = jac(x1), jac(x2)
  return jnp.einsum("nop,mop->nm", j1, j2) / j1.shape[1]


def _erf_step(k11, k12, k22):
  """E[erf u erf v], E[erf' u erf' v] for (u, v) ~ N(0, [[k11, k12], [k12, k22]])."""
  a = (1.0 + 2.0 * k11) * (1.0 + 2.0 * k22)
  e = 2.0 / np.pi * np.arcsin(2.0 * k12 / np.sqrt(a))
  e_dot = 4.0 / np.pi / np.sqrt(a - 4.0 * k12**2)
  return e, e_dot


def _wedge_sq(x1: np.ndarray, x2: np.ndarray) -> np.ndarray:
  """|x ∧ x'|² = |x|²|x'|² − (x·x')², by Lagrange's identity (no cancellation): (N1, N2)."""
  outer = x1[:, None, :, None] * x2[None, :, None, :]  # (N1, N2, d, d): x_i x'_j
  return 0.5 * np.sum((outer - np.swapaxes(outer, -1, -2)) ** 2, axis=(-1, -2))


def _relu_closed_form(x1, x2, depth, sw2, sb2):
  """ReLU recursion carrying the angle θ accurately.

  arccos(K₁₂/sqrt(K₁₁K₂₂)) loses half the digits when the inputs are (nearly) parallel:
  cos θ = 1 − O(ε) leaves θ = O(sqrt ε) ≈ 1e-8, and Θ picks up (π − θ)/(2π) errors of
  ~1e-9. So the recursion carries the gap D = K₁₁K₂₂ − K₁₂² = (sqrt(K₁₁K₂₂) sin θ)², computed
  without cancellation, and takes θ = atan2(sqrt D, K₁₂):

    layer 1:  D = a²|x ∧ x'|² + a s |x − x'|²            (a = σ_w²/d, s = σ_b²)
    ReLU:     with n = sqrt(K₁₁K₂₂), J = (sin θ + (π − θ) cos θ)/π, c = σ_w²/2,
              K'₁₂ = c n J + s,  D' = c² n² (1 − J)(1 + J) + c s ((√K₁₁ − √K₂₂)² + 2n(1 − J)),
              1 − J = (2π sin²(θ/2) − (sin θ − θ cos θ)) / π.
  """
  d = x1.shape[1]
  a = sw2 / d
  k12 = a * (x1 @ x2.T) + sb2
  k11 = (a * np.sum(x1 * x1, axis=1) + sb2)[:, None]
  k22 = (a * np.sum(x2 * x2, axis=1) + sb2)[None, :]
  diff_sq = np.sum((x1[:, None, :] - x2[None, :, :]) ** 2, axis=-1)
  gap = a * a * _wedge_sq(x1, x2) + a * sb2 * diff_sq
  t12 = k12.copy()
  c = sw2 / 2.0
  for _ in range(depth):
    theta = np.arctan2(np.sqrt(gap), k12)
    n = np.sqrt(k11 * k22)
    one_minus_j = (
        2.0 * np.pi * np.sin(theta / 2.0) ** 2 - (np.sin(theta) - theta * np.cos(theta))
    ) / np.pi
    j = 1.0 - one_minus_j
    e_dot = (np.pi - theta) / (2.0 * np.pi)
    new_k12 = c * n * j + sb2
    gap = c * c * n * n * one_minus_j * (1.0 + j) + c * sb2 * (
        (np.sqrt(k11) - np.sqrt(k22)) ** 2 + 2.0 * n * one_minus_j
    )
    k12, k11, k22 = new_k12, c * k11 + sb2, c * k22 + sb2
    t12 = k12 + sw2 * e_dot * t12
  return t12, k12


def closed_form_mlp_kernels(
    x1: np.ndarray,
    x2: np.ndarray,
    depth: int,
    w_std: float,
    b_std: float | None,
    activation: str = "relu",
) -> tuple[np.ndarray, np.ndarray]:
  """(NTK, NNGP) of an infinitely wide MLP in NTK parameterisation, in numpy float64.

  Args:
    x1: (N1, d), x2: (N2, d) inputs. depth: number of hidden layers.
    w_std, b_std: σ_w, σ_b as in ``MLPSpec`` (``b_std=None``: no biases).
    activation: "relu" (arc-cosine recursion) or "erf" (Williams 1997).
  """
  x1, x2 = np.asarray(x1, np.float64), np.asarray(x2, np.float64)
  d = x1.shape[1]
  sb2 = 0.0 if b_std is None else float(b_std) ** 2
  sw2 = float(w_std) ** 2
  if activation == "relu":
    return _relu_closed_form(x1, x2, depth, sw2, sb2)
  # Pre-activation covariances of layer 1: the cross block and the two diagonals.
  k12 = sw2 * (x1 @ x2.T) / d + sb2
  k11 = sw2 * np.sum(x1 * x1, axis=1) / d + sb2
  k22 = sw2 * np.sum(x2 * x2, axis=1) / d + sb2
  t12 = k12.copy()
  for _ in range(depth):
    e12, e12_dot = _erf_step(k11[:, None], k12, k22[None, :])
    e11, _ = _erf_step(k11, k11, k11)
    e22, _ = _erf_step(k22, k22, k22)
    k12, k11, k22 = sw2 * e12 + sb2, sw2 * e11 + sb2, sw2 * e22 + sb2
    t12 = k12 + sw2 * e12_dot * t12
  return t12, k12


# ----------------------------------------------------------------------------------------------
# The three checks.
# ----------------------------------------------------------------------------------------------


def check_empirical(seed: int, spec_names) -> dict:
  """{"<spec>/<kernel>": max rel err} of every empirical kernel against the Jacobian product."""
  specs = {k: EMPIRICAL_SPECS[k] for k in spec_names}
  errs = {}
  key = jax.random.PRNGKey(seed)
  for name, spec in specs.items():
    shape = (6, 6, 2) if isinstance(spec, models.CNNSpec) else (5,)
    k1, k2, k3, key = jax.random.split(key, 4)
    x1 = jax.random.normal(k1, (6, *shape))
    x2 = jax.random.normal(k2, (4, *shape))
    net = models.module(spec)
    params = net.init(k3, x1)
    ref = reference_jacobian_ntk(net.apply, params, x1, x2)
    for impl in ntk.IMPLEMENTATIONS:
      errs[f"{name}/empirical_ntk[{impl}]"] = agreement.max_rel_err(
          ntk.empirical_ntk(net.apply, params, x1, x2, implementation=impl), ref
      )
    errs[f"{name}/jacobian_ntk"] = agreement.max_rel_err(
        ntk.jacobian_ntk(net.apply, params, x1, x2), ref
    )
    if isinstance(spec, models.MLPSpec) and spec.parameterization == "ntk":
      # The factorised kernel the contextual closed forms use.
      errs[f"{name}/factorised_ntk.mlp_empirical_ntk"] = agreement.max_rel_err(
          factorised_ntk.mlp_empirical_ntk(spec, params, x1, x2), ref
      )
    # x2 = None (the symmetric Gram matrix) as well.
    ref11 = reference_jacobian_ntk(net.apply, params, x1, x1)
    errs[f"{name}/empirical_ntk_gram"] = agreement.max_rel_err(
        ntk.empirical_ntk(net.apply, params, x1), ref11
    )
    runner.log(
        NAME,
        f"empirical vs jacobian {name}: max {max(v for k, v in errs.items() if k.startswith(name)):.2e}",
    )
  return errs


def check_infinite(seed: int, depths, w_stds, b_stds) -> tuple[dict, dict, dict, dict]:
  """Max rel errs of the infinite-width kernels against the closed forms: ReLU NTK, ReLU NNGP,
  erf (max of both) and the ReLU NTK entry by entry, each {tag: err}."""
  rng = np.random.default_rng(seed)
  d = 5
  # Random inputs of mixed norms, a duplicate, a negated copy and the zero vector's neighbour.
  x1 = rng.normal(size=(7, d)) * rng.uniform(0.3, 3.0, (7, 1))
  x1 = np.concatenate([x1, x1[:1], -x1[1:2], 1e-3 * x1[2:3]])
  x2 = rng.normal(size=(5, d)) * 2.0
  ntk_errs, nngp_errs, erf_errs, entrywise = {}, {}, {}, {}
  for depth in depths:
    for w_std in w_stds:
      for b_std in b_stds:
        spec = models.MLPSpec(widths=(512,) * depth, w_std=w_std, b_std=b_std)
        for pair, (a, b) in {"cross": (x1, x2), "gram": (x1, None)}.items():
          k = ntk.infinite_kernels(spec, a, b)
          cf_ntk, cf_nngp = closed_form_mlp_kernels(a, a if b is None else b, depth, w_std, b_std)
          tag = f"relu/depth{depth}/w{w_std:.3f}/b{b_std}/{pair}"
          ntk_errs[tag] = agreement.max_rel_err(k.ntk, cf_ntk)
          entrywise[tag] = float(np.max(np.abs(np.asarray(k.ntk) - cf_ntk) / np.abs(cf_ntk)))
          nngp_errs[tag] = agreement.max_rel_err(k.nngp, cf_nngp)
    for b_std in (None, 0.5):
      spec = models.MLPSpec(widths=(512,) * depth, activation="erf", w_std=1.5, b_std=b_std)
      k = ntk.infinite_kernels(spec, x1, x2)
      cf_ntk, cf_nngp = closed_form_mlp_kernels(x1, x2, depth, 1.5, b_std, "erf")
      erf_errs[f"erf/depth{depth}/b{b_std}"] = max(
          agreement.max_rel_err(k.ntk, cf_ntk), agreement.max_rel_err(k.nngp, cf_nngp)
      )
    runner.log(
        NAME,
        f"infinite vs closed form, depth {depth}: relu NTK max "
        f"{max(v for t, v in ntk_errs.items() if f'depth{depth}/' in t):.2e}",
    )
  return ntk_errs, nngp_errs, erf_errs, entrywise


def width_sweep(seed: int, widths, num_seeds: int) -> list[dict]:
  """One row per width: ‖Θ̂ − Θ‖_F/‖Θ‖_F, rms over ``num_seeds`` inits, and per seed."""
  rng = np.random.default_rng(seed)
  x = jnp.asarray(problems.sphere_points(rng, 8, 4))
  out = []
  inf = None
  for width in widths:
    spec = models.MLPSpec(widths=(width, width), b_std=0.1)
    if inf is None:
      inf = ntk.infinite_kernels(spec, x, None, ("ntk",)).ntk
    net = models.module(spec)
    apply = net.apply  # one function object per width: one compilation per width
    errs = []
    for s in range(num_seeds):
      params = net.init(jax.random.PRNGKey(1000 * seed + s), x[:1])
      errs.append(agreement.rel_err(ntk.empirical_ntk(apply, params, x), inf))
      del params
    rms = float(np.sqrt(np.mean(np.square(errs))))
    out.append({"width": width, "rel_err": rms, "rel_err_per_seed": errs})
    runner.log(NAME, f"width {width:5d}: rel err {rms:.3e} (rms over {num_seeds} seeds)")
  return out


def check_config(config: ml_collections.ConfigDict) -> None:
  """Raises ``cli.ConfigError`` naming the first field out of range."""
  cli.check(
      config,
      non_negative=("seed",),
      positive=("sweep_seeds",),
      subset_of={"empirical_specs": EMPIRICAL_SPECS},
  )
  if len(config.sweep_widths) < 2 or min(config.sweep_widths) <= 0:
    raise cli.ConfigError(
        "--config.sweep_widths must be two or more positive widths (a slope), "
        f"got {config.sweep_widths!r}"
    )
  for path in ("infinite_depths", "infinite_w_stds"):
    if not config[path] or min(config[path]) <= 0:
      raise cli.ConfigError(f"--config.{path} must be positive values, got {config[path]!r}")


def run(config: ml_collections.ConfigDict, out_dir: str) -> dict:
  """The three checks of ``config`` (``configs/ntk_check.py``); writes ntk_check.json and .png."""
  check_config(config)
  runner.enable_x64()
  seed = config.seed
  emp = check_empirical(seed, cli.split_list(config.empirical_specs))
  ntk_errs, nngp_errs, erf_errs, entrywise = check_infinite(
      seed, config.infinite_depths, config.infinite_w_stds, config.infinite_b_stds
  )
  sweep = width_sweep(seed, config.sweep_widths, num_seeds=config.sweep_seeds)
  ws = [r["width"] for r in sweep]
  es = [r["rel_err"] for r in sweep]
  result = {
      "empirical_vs_jacobian_max_rel_err": max(emp.values()),
      "infinite_vs_closed_form_max_rel_err": max(ntk_errs.values()),
      "infinite_nngp_vs_closed_form_max_rel_err": max(nngp_errs.values()),
      "infinite_erf_vs_closed_form_max_rel_err": max(erf_errs.values()),
      # Entry by entry, |a − b|/|b|: neural-tangents takes θ = atan2(sqrt(K11 K22 − K12²), K12),
      # which for parallel inputs of different norms (here x and 1e-3 x) leaves θ ~ 1e-8 instead
      # of 0, an entry error ~ 1e-9 that the closed form here (which carries the gap
      # K11 K22 − K12² without cancellation) does not have.
      "infinite_vs_closed_form_max_entrywise_rel_err": max(entrywise.values()),
      "width_sweep": [{"width": r["width"], "rel_err": r["rel_err"]} for r in sweep],
      "width_sweep_loglog_slope": agreement.loglog_slope(ws, es),
      "targets": {"max_rel_err": 1e-10, "width_sweep_slope": -0.5},
      "details": {
          "empirical_vs_jacobian": emp,
          "infinite_vs_closed_form_relu_ntk": ntk_errs,
          "infinite_vs_closed_form_relu_ntk_entrywise": entrywise,
          "infinite_vs_closed_form_relu_nngp": nngp_errs,
          "infinite_vs_closed_form_erf": erf_errs,
          "width_sweep_per_seed": sweep,
          "width_sweep_setup": "MLPSpec(widths=(n, n), b_std=0.1), 8 points on the "
          "unit sphere in R^4, ||Θ̂ − Θ||_F/||Θ||_F",
      },
      "config": config,
  }
  runner.write_json(out_dir, NAME, result)

  fig, axes = plots.figure()
  ax = axes[0, 0]
  plots.plot_against_width(ax, ws, es, "‖Θ̂ − Θ‖_F / ‖Θ‖_F (rms over seeds)")
  ax.set_ylabel("relative error")
  ax.set_title(f"finite-width NTK → infinite (slope {result['width_sweep_loglog_slope']:.2f})")
  ax.legend()
  plots.save_figure(fig, out_dir, NAME)
  runner.log(
      NAME,
      f"empirical vs jacobian {result['empirical_vs_jacobian_max_rel_err']:.2e}, "
      f"infinite vs closed form {result['infinite_vs_closed_form_max_rel_err']:.2e}, "
      f"slope {result['width_sweep_loglog_slope']:.3f}; wrote {out_dir}/{NAME}.json",
  )
  return result


if __name__ == "__main__":
  runner.main(NAME, run, check_config)
