"""How close two arrays are: the error and rank measures the validation binaries report."""

from __future__ import annotations

import numpy as np
from scipy import stats


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
  """Spearman rank correlation of two (M,) arrays; NaN, where it is undefined, when either is
  constant (e.g. the zero estimator's variances)."""
  a, b = np.asarray(a), np.asarray(b)
  if np.all(a == a.flat[0]) or np.all(b == b.flat[0]):
    return float("nan")
  return float(stats.spearmanr(a, b).statistic)


def median_norm_abs_err(v, v_ref, prior) -> float:
  """median over queries of |v − v_ref| / prior, prior = k(x, x) of the reference kernel;
  all three (M,)."""
  v, v_ref, prior = (np.asarray(t, np.float64) for t in (v, v_ref, prior))
  return float(np.median(np.abs(v - v_ref) / prior))


def agreement(v, v_ref, prior, mask=None) -> dict:
  """{"spearman", "median_norm_abs_err", "rel_err" (‖v − v_ref‖/‖v_ref‖), "n"} of v (M,) against
  v_ref (M,), prior (M,), on the (M,) bool ``mask`` if given."""
  v, v_ref, prior = (np.asarray(t, np.float64) for t in (v, v_ref, prior))
  if mask is not None:
    v, v_ref, prior = v[mask], v_ref[mask], prior[mask]
  return {
      "spearman": spearman(v, v_ref) if len(v) > 2 else float("nan"),
      "median_norm_abs_err": median_norm_abs_err(v, v_ref, prior),
      "rel_err": rel_err(v, v_ref),
      "n": int(len(v)),
  }


def loglog_slope(x, y) -> float:
  """Least-squares slope of log y against log x, both (K,)."""
  return float(
      np.polyfit(np.log(np.asarray(x, np.float64)), np.log(np.asarray(y, np.float64)), 1)[0]
  )
