"""OOD-detection metrics (scikit-learn) and accuracy.

Convention: a score is higher for inputs that look more out-of-distribution (e.g. a predictive
variance). The OOD set is the positive class for AUROC and AUPR-OUT; AUPR-IN takes the
in-distribution set as positive and ranks by the negated score.
"""

from __future__ import annotations

import numpy as np
from sklearn import metrics as skm

from csd_jax.checks import check_array


def _as_float(x, name: str, rank: int) -> np.ndarray:
  """A finite, non-empty float64 copy of ``x`` with ``rank`` axes, or a ValueError naming it."""
  x = np.asarray(x)
  if not np.issubdtype(x.dtype, np.number) or np.issubdtype(x.dtype, np.complexfloating):
    raise ValueError(f"{name} must be real numbers, got dtype {x.dtype}")
  x = x.astype(np.float64)
  check_array(name, x, rank=rank)
  return x


def _labelled(scores_in, scores_out) -> tuple[np.ndarray, np.ndarray]:
  """Concatenated scores (N_in + N_out,) and labels (1 = OOD, 0 = in-distribution)."""
  s_in, s_out = _as_float(scores_in, "scores_in", 1), _as_float(scores_out, "scores_out", 1)
  labels = np.concatenate([np.zeros(s_in.size, np.int32), np.ones(s_out.size, np.int32)])
  return np.concatenate([s_in, s_out]), labels


def ood_metrics(scores_in, scores_out) -> dict[str, float]:
  """AUROC, AUPR-IN and AUPR-OUT of separating in-distribution from OOD inputs by score.

  Args:
    scores_in: (N_in,) scores of in-distribution inputs.
    scores_out: (N_out,) scores of out-of-distribution inputs; higher = more OOD.

  Returns:
    {"auroc": ..., "aupr_in": ..., "aupr_out": ...}, floats in [0, 1]. AUPR is sklearn's average
    precision.
  """
  scores, is_ood = _labelled(scores_in, scores_out)
  return {
      "auroc": float(skm.roc_auc_score(is_ood, scores)),
      "aupr_in": float(skm.average_precision_score(1 - is_ood, -scores)),
      "aupr_out": float(skm.average_precision_score(is_ood, scores)),
  }


def roc_curve_points(scores_in, scores_out) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """ROC curve with OOD as positive: (fpr, tpr, thresholds), each (K,), for plotting."""
  scores, is_ood = _labelled(scores_in, scores_out)
  fpr, tpr, thresholds = skm.roc_curve(is_ood, scores)
  return fpr, tpr, thresholds


def accuracy(logits_or_probs, labels) -> float:
  """Fraction of rows whose argmax over the last axis equals the label.

  Args:
    logits_or_probs: (N, K) logits or probabilities.
    labels: (N,) integer class labels in [0, K).
  """
  preds, labels = _as_float(logits_or_probs, "logits_or_probs", 2), np.asarray(labels)
  if preds.shape[1] == 0:
    raise ValueError(f"logits_or_probs must have shape (N, K) with K > 0, got {preds.shape}")
  if labels.shape != (preds.shape[0],):
    raise ValueError(f"labels must have shape ({preds.shape[0]},), got {labels.shape}")
  if not np.issubdtype(labels.dtype, np.integer):
    raise ValueError(f"labels must be integers, got dtype {labels.dtype}")
  if np.any((labels < 0) | (labels >= preds.shape[1])):
    raise ValueError(f"labels must lie in [0, {preds.shape[1]})")
  return float(np.mean(np.argmax(preds, axis=-1) == labels))
