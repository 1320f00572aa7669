"""Shared helpers of the validation binaries: flags, x64, output, metrics, toy data sets.

Every binary ``validation/<name>.py`` is run as ``python -m validation.<name> --out_dir=DIR
[--quick]`` and has a ``run(out_dir, quick=False, seed=0, ...) -> dict`` that does the work
(the tests call it in-process); it writes ``DIR/<name>.json`` and ``DIR/<name>*.png``.
The common flags are defined here, once, so that importing several binaries into one process
(the tests do) never defines a flag twice.

Toy data (all float64 numpy arrays once ``enable_x64`` ran):

* ``toy_1d``: a 1-D regression set in two clusters, lifted by a fixed random Fourier embedding
  ``FourierEmbedding`` (``e(x) = sqrt(2/m) cos(w x + b)``, w ~ N(0, scale²), b ~ U[0, 2π)) so the
  networks see an m-dimensional input. Raw 1-D inputs are a degenerate toy for ReLU nets with a
  small bias (DESIGN.md §3: their last-layer variance is ~0 everywhere): x > 0 and x < 0 give
  nearly collinear features. Through the embedding, points a few length scales apart have nearly
  orthogonal inputs, so the variance really grows away from the data.
* ``toy_2d``: two Gaussian clusters in the plane (DESIGN.md §3 probe), queries uniform in a box.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from typing import Any, Callable

import numpy as np
from absl import app
from absl import flags

from uncertainty_kit import flag_checks

FLAGS = flags.FLAGS

_START = time.perf_counter()


# ----------------------------------------------------------------------------------------------
# Environment, progress, output.
# ----------------------------------------------------------------------------------------------


def enable_x64(on: bool = True) -> None:
  """Turns float64 on (the validation numbers are about float64). Call before any array."""
  import jax  # pylint: disable=g-import-not-at-top
  jax.config.update("jax_enable_x64", bool(on))


def log(name: str, msg: str) -> None:
  """A progress line on stdout: ``[name  12.3s] msg``."""
  print(f"[{name} {time.perf_counter() - _START:7.1f}s] {msg}", flush=True)


def _jsonable(obj: Any) -> Any:
  if isinstance(obj, dict):
    return {str(k): _jsonable(v) for k, v in obj.items()}
  if isinstance(obj, (list, tuple)):
    return [_jsonable(v) for v in obj]
  if isinstance(obj, (bool, np.bool_)):
    return bool(obj)
  if isinstance(obj, (int, np.integer)):
    return int(obj)
  if isinstance(obj, (float, np.floating)):
    v = float(obj)
    return v if math.isfinite(v) else str(v)
  if hasattr(obj, "shape"):  # numpy / jax array
    return _jsonable(np.asarray(obj).tolist())
  return obj


def write_json(out_dir: str, name: str, result: dict) -> str:
  """Writes ``out_dir/name.json`` (numpy and jax values converted); returns the path."""
  os.makedirs(out_dir, exist_ok=True)
  path = os.path.join(out_dir, f"{name}.json")
  with open(path, "w") as f:
    json.dump(_jsonable(result), f, indent=2, sort_keys=False)
    f.write("\n")
  return path


def figure(nrows: int = 1, ncols: int = 1, size: tuple[float, float] = (5.0, 4.0)):
  """A matplotlib (fig, axes) on the non-interactive Agg backend."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, axes = plt.subplots(nrows, ncols, figsize=(size[0] * ncols, size[1] * nrows),
                           squeeze=False)
  return fig, axes


def plot_against_width(ax, widths, errs, label: str) -> None:
  """Log-log ``errs`` vs ``widths`` with the ``c/√width`` reference (c fitted in log space)."""
  ax.loglog(widths, errs, "o-", label=label)
  c = math.exp(np.mean(np.log(errs) + 0.5 * np.log(widths)))
  grid = np.geomspace(widths[0], widths[-1], 50)
  ax.loglog(grid, c / np.sqrt(grid), "k--", label="c / √width")
  ax.set_xticks(widths)
  ax.set_xticklabels([str(w) for w in widths])
  ax.minorticks_off()
  ax.set_xlabel("width")


def save_figure(fig, out_dir: str, name: str) -> str:
  """Saves ``out_dir/name.png`` and closes the figure; returns the path."""
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  os.makedirs(out_dir, exist_ok=True)
  path = os.path.join(out_dir, f"{name}.png")
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return path


def define_flags() -> None:
  """Defines the flags every validation binary takes.

  Called from ``run_main`` only, never at import: importing a binary module (the tests import
  several, and the RL and benchmark binaries into the same process) must define no flag, or
  absl raises ``DuplicateFlagError`` on the second ``--out_dir``.
  """
  flags.DEFINE_string("out_dir", "out/validation", "Folder for <name>.json and <name>*.png.")
  flags.DEFINE_bool("quick", False, "Small sizes: finishes in under a minute on 2 CPU cores.")
  flags.DEFINE_integer("seed", 0, "Seed of every random draw.")
  flag_checks.writable_dir("out_dir")
  flag_checks.non_negative("seed")


def run_main(run: Callable[..., dict], define_extra_flags: Callable[[], None] | None = None,
             **extra) -> None:
  """Defines the flags, parses argv and calls ``run(out_dir, quick, seed, **extra)``.

  ``extra`` values that are callables are called after parsing (to read the binary's own flags,
  which ``define_extra_flags`` defines).
  """
  define_flags()
  if define_extra_flags is not None:
    define_extra_flags()

  def main(argv):
    if len(argv) > 1:
      raise SystemExit(f"unexpected arguments: {argv[1:]}")
    kwargs = {k: (v() if callable(v) else v) for k, v in extra.items()}
    flag_checks.record(FLAGS.out_dir, os.path.splitext(os.path.basename(sys.argv[0]))[0])
    run(out_dir=FLAGS.out_dir, quick=FLAGS.quick, seed=FLAGS.seed, **kwargs)

  app.run(main)


# ----------------------------------------------------------------------------------------------
# Metrics.
# ----------------------------------------------------------------------------------------------


def rel_err(a, b) -> float:
  """‖a − b‖₂ / ‖b‖₂ over all entries."""
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def max_rel_err(a, b) -> float:
  """max |a − b| / max |b|: the largest entry error relative to the matrix's scale.

  (An entry-wise ratio would blow up on entries that are legitimately ~0.)
  """
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def spearman(a, b) -> float:
  """Spearman rank correlation of two (M,) arrays."""
  from scipy import stats  # pylint: disable=g-import-not-at-top
  return float(stats.spearmanr(np.asarray(a), np.asarray(b)).statistic)


def median_norm_abs_err(v, v_ref, prior) -> float:
  """median over queries of |v − v_ref| / prior, prior = k(x, x) of the reference kernel."""
  v, v_ref, prior = (np.asarray(t, np.float64) for t in (v, v_ref, prior))
  return float(np.median(np.abs(v - v_ref) / prior))


def agreement(v, v_ref, prior, mask=None) -> dict:
  """{"spearman", "median_norm_abs_err", "rel_err" (‖v − v_ref‖/‖v_ref‖), "n"} of v against
  v_ref, on ``mask`` if given."""
  v, v_ref, prior = (np.asarray(t, np.float64) for t in (v, v_ref, prior))
  if mask is not None:
    v, v_ref, prior = v[mask], v_ref[mask], prior[mask]
  return {"spearman": spearman(v, v_ref) if len(v) > 2 else float("nan"),
          "median_norm_abs_err": median_norm_abs_err(v, v_ref, prior),
          "rel_err": rel_err(v, v_ref), "n": int(len(v))}


def loglog_slope(x, y) -> float:
  """Least-squares slope of log y against log x."""
  return float(np.polyfit(np.log(np.asarray(x, np.float64)), np.log(np.asarray(y, np.float64)),
                          1)[0])


# ----------------------------------------------------------------------------------------------
# Toy data sets.
# ----------------------------------------------------------------------------------------------


class FourierEmbedding:
  """A fixed random Fourier embedding of scalars: ``e(x) = sqrt(2/m) cos(x w + b)``, (M, m).

  With w ~ N(0, 1/length_scale²), ``e(x)·e(x')`` ≈ exp(−(x − x')² / (2 length_scale²)) and
  ``‖e(x)‖² ≈ 1``: nearby inputs map to nearly parallel vectors, distant ones to nearly
  orthogonal ones.
  """

  def __init__(self, dim: int = 32, length_scale: float = 1.0, seed: int = 0):
    rng = np.random.default_rng(10_000 + seed)
    self.dim = dim
    self.w = rng.normal(0.0, 1.0 / length_scale, (1, dim))
    self.b = rng.uniform(0.0, 2.0 * np.pi, dim)

  def __call__(self, x) -> np.ndarray:
    x = np.asarray(x, np.float64).reshape(-1, 1)
    return np.sqrt(2.0 / self.dim) * np.cos(x @ self.w + self.b)


def toy_1d(seed: int = 0, n_per_cluster: int = 10, centres=(-2.0, 1.5), std: float = 0.4,
           num_queries: int = 241, query_range: float = 6.0, embed_dim: int = 32,
           length_scale: float = 1.0, noise: float = 0.05) -> dict:
  """1-D regression toy (two clusters), lifted by ``FourierEmbedding``.

  Returns a dict:
    t_train (N,), y_train (N,): raw inputs and targets y = sin(2t) + noise.
    x_train (N, m): embedded inputs.  t_query (M,), x_query (M, m): a grid on ±query_range.
    in_dist (M,) bool: queries within 2·std of a cluster centre.  embed: the FourierEmbedding.
  """
  rng = np.random.default_rng(seed)
  t = np.concatenate([rng.normal(c, std, n_per_cluster) for c in centres])
  y = np.sin(2.0 * t) + noise * rng.normal(size=t.shape)
  emb = FourierEmbedding(embed_dim, length_scale, seed)
  tq = np.linspace(-query_range, query_range, num_queries)
  in_dist = np.min(np.abs(tq[:, None] - np.asarray(centres)[None]), axis=1) <= 2.0 * std
  return {"t_train": t, "y_train": y, "x_train": emb(t), "t_query": tq, "x_query": emb(tq),
          "in_dist": in_dist, "embed": emb}


def toy_2d(seed: int = 0, n_per_cluster: int = 20, centre: float = 1.5, std: float = 0.4,
           num_queries: int = 400, box: float = 4.0) -> dict:
  """Two Gaussian clusters at (±centre, ±centre) in the plane (DESIGN.md §3 probe).

  Returns a dict: x_train (N, 2); x_query (M, 2) uniform in [−box, box]²; in_dist (M,) bool:
  within 2·std·sqrt(2) of a cluster centre (≈ the clusters' 86 % mass radius).
  """
  rng = np.random.default_rng(seed)
  centres = np.array([[-centre, -centre], [centre, centre]])
  x = np.concatenate([rng.normal(c, std, (n_per_cluster, 2)) for c in centres])
  xq = rng.uniform(-box, box, (num_queries, 2))
  dist = np.min(np.linalg.norm(xq[:, None] - centres[None], axis=-1), axis=1)
  return {"x_train": x, "x_query": xq, "in_dist": dist <= 2.0 * std * np.sqrt(2.0),
          "centres": centres}


def sphere_points(rng: np.random.Generator, n: int, dim: int, radius: float = 1.0) -> np.ndarray:
  """n points uniform on the sphere of ``radius`` in R^dim."""
  x = rng.normal(size=(n, dim))
  return radius * x / np.linalg.norm(x, axis=1, keepdims=True)


# ----------------------------------------------------------------------------------------------
# A factorised empirical NTK for MLPs (no Jacobian in memory).
# ----------------------------------------------------------------------------------------------


def mlp_empirical_ntk(spec, params, x1, x2=None):
  """Θ̂(x1, x2) of an ``MLPSpec`` net in NTK parameterisation, factorised layer by layer.

  For a layer y = σ_w/sqrt(fan_in) a W + σ_b b, the parameter gradients are outer products of
  the layer's input a and the backpropagated vector δ = ∂f/∂y, so

      Θ̂(x, x') = 1/out Σ_k Σ_l (σ_w²/fan_in a_{l−1}(x)·a_{l−1}(x') + σ_b²) δ_{l,k}(x)·δ_{l,k}(x'),

  which costs O(N1 N2 width) per layer instead of O(N1 N2 #params) and never holds a Jacobian
  (the MNIST closed forms need it). Same value as ``ntk.empirical_ntk`` (``ntk_check`` checks it).

  Args:
    spec: an ``MLPSpec`` with ``parameterization="ntk"``.
    params: the net's flax params. x1: (N1, d). x2: (N2, d) or None (= x1).

  Returns:
    (N1, N2) kernel.
  """
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  if spec.parameterization != "ntk" or hasattr(spec, "convs"):
    raise ValueError("mlp_empirical_ntk supports MLPSpec in NTK parameterisation only")
  p = params["params"]
  act = {"relu": jax.nn.relu, "erf": jax.scipy.special.erf}[spec.activation]
  act_grad = {"relu": lambda y: (y > 0).astype(y.dtype),
              "erf": lambda y: 2.0 / jnp.sqrt(jnp.pi) * jnp.exp(-y * y)}[spec.activation]
  sb2 = 0.0 if spec.b_std is None else spec.b_std ** 2
  names = [f"dense_layers_{i}" for i in range(len(spec.widths))] + ["head"]

  def layer_terms(x):
    """Inputs a_{l-1} (B, fan_in) and deltas δ_l (B, out, width) for every layer."""
    acts, pre = [x], []
    a = x
    for name in names[:-1]:
      w = p[name]["kernel"]
      y = spec.w_std / jnp.sqrt(a.shape[-1]) * a @ w
      if spec.b_std is not None:
        y = y + spec.b_std * p[name]["bias"]
      pre.append(y)
      a = act(y)
      acts.append(a)
    out = spec.out_dim
    delta = jnp.broadcast_to(jnp.eye(out, dtype=x.dtype), (x.shape[0], out, out))
    deltas = [delta]
    for i in range(len(names) - 1, 0, -1):  # from the head down to the first layer
      w = p[names[i]]["kernel"]  # (fan_in, width_i)
      scale = spec.w_std / jnp.sqrt(w.shape[0])
      delta = scale * jnp.einsum("bkj,ij->bki", delta, w) * act_grad(pre[i - 1])[:, None, :]
      deltas.append(delta)
    return acts, deltas[::-1]

  @jax.jit
  def kernel(x1, x2):
    a1, d1 = layer_terms(x1)
    a2, d2 = layer_terms(x2)
    total = 0.0
    for l in range(len(names)):
      fan_in = a1[l].shape[-1]
      inputs = spec.w_std ** 2 / fan_in * (a1[l] @ a2[l].T) + sb2
      total = total + inputs * jnp.einsum("bkj,ckj->bc", d1[l], d2[l])
    return total / spec.out_dim

  x1 = jnp.asarray(x1)
  return kernel(x1, x1 if x2 is None else jnp.asarray(x2))
