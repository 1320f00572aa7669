"""Tests for uncertainty_kit.metrics."""

import itertools

import jax.numpy as jnp
import numpy as np
import pytest
from sklearn import metrics as skm

from uncertainty_kit import metrics


def test_perfect_separation_scores_one():
  m = metrics.ood_metrics([0.0, 0.1, 0.2], [0.5, 0.9])
  assert m == {"auroc": 1.0, "aupr_in": 1.0, "aupr_out": 1.0}


def test_reversed_separation():
  m = metrics.ood_metrics([2.0, 3.0], [0.0, 1.0])
  assert m["auroc"] == 0.0
  # Ranked by score: in, in, out, out. OOD hits at ranks 3 and 4: (1/3 + 2/4) / 2.
  assert m["aupr_out"] == pytest.approx(5 / 12)
  # By -score: out, out, in, in: in-distribution hits at ranks 3 and 4.
  assert m["aupr_in"] == pytest.approx(5 / 12)


def test_hand_computed_case():
  scores_in, scores_out = [0.1, 0.4, 0.35], [0.8, 0.3]
  m = metrics.ood_metrics(scores_in, scores_out)
  # Pairs (out > in): 0.8 beats all 3, 0.3 beats 0.1 only: 4 of 6.
  assert m["auroc"] == pytest.approx(4 / 6)
  # Descending: 0.8 out, 0.4 in, 0.35 in, 0.3 out, 0.1 in; OOD hits at ranks 1 and 4.
  assert m["aupr_out"] == pytest.approx((1 / 1 + 2 / 4) / 2)
  # Descending -score: 0.1 in, 0.3 out, 0.35 in, 0.4 in, 0.8 out; ID hits at ranks 1, 3, 4.
  assert m["aupr_in"] == pytest.approx((1 / 1 + 2 / 3 + 3 / 4) / 3)


def test_ties_count_half():
  assert metrics.ood_metrics([0.5], [0.5])["auroc"] == pytest.approx(0.5)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_sklearn_and_pair_counting_on_random_data(seed):
  rng = np.random.default_rng(seed)
  s_in = rng.normal(0.0, 1.0, 37)
  s_out = rng.normal(0.7, 1.3, 23)
  m = metrics.ood_metrics(s_in, s_out)
  y = np.r_[np.zeros(37), np.ones(23)]
  s = np.r_[s_in, s_out]
  assert m["auroc"] == pytest.approx(skm.roc_auc_score(y, s))
  assert m["aupr_out"] == pytest.approx(skm.average_precision_score(y, s))
  assert m["aupr_in"] == pytest.approx(skm.average_precision_score(1 - y, -s))
  pairs = np.mean([float(o > i) + 0.5 * float(o == i) for i, o in itertools.product(s_in, s_out)])
  assert m["auroc"] == pytest.approx(pairs)


def test_invariant_to_monotone_transform_and_accepts_jax_arrays():
  rng = np.random.default_rng(3)
  s_in, s_out = rng.normal(size=20), rng.normal(1.0, size=15)
  a = metrics.ood_metrics(s_in, s_out)
  b = metrics.ood_metrics(jnp.exp(jnp.asarray(s_in)), jnp.exp(jnp.asarray(s_out)))
  assert a == pytest.approx(b)


def test_roc_curve_points_area_is_auroc():
  rng = np.random.default_rng(4)
  s_in, s_out = rng.normal(size=30), rng.normal(0.5, size=30)
  fpr, tpr, thresholds = metrics.roc_curve_points(s_in, s_out)
  assert fpr.shape == tpr.shape == thresholds.shape
  assert fpr[0] == 0.0 and tpr[0] == 0.0 and fpr[-1] == 1.0 and tpr[-1] == 1.0
  assert np.all(np.diff(fpr) >= 0) and np.all(np.diff(tpr) >= 0)
  assert np.trapezoid(tpr, fpr) == pytest.approx(metrics.ood_metrics(s_in, s_out)["auroc"])


@pytest.mark.parametrize(
    "scores_in, scores_out, match",
    [
        ([], [1.0], "scores_in is empty"),
        ([1.0], [], "scores_out is empty"),
        ([[1.0, 2.0]], [1.0], "scores_in must have rank 1"),
        (1.0, [1.0], "scores_in must have rank 1"),
        ([1.0, np.nan], [1.0], "scores_in contains NaN"),
        ([1.0], [np.inf], "scores_out contains NaN or Inf"),
        (["a"], [1.0], "real numbers"),
    ],
)
def test_bad_scores_raise(scores_in, scores_out, match):
  with pytest.raises(ValueError, match=match):
    metrics.ood_metrics(scores_in, scores_out)
  with pytest.raises(ValueError, match=match):
    metrics.roc_curve_points(scores_in, scores_out)


def test_accuracy():
  logits = np.array([[2.0, 1.0, 0.0], [0.0, 3.0, 1.0], [0.1, 0.2, 0.3], [5.0, 0.0, 0.0]])
  assert metrics.accuracy(logits, np.array([0, 1, 0, 0])) == pytest.approx(0.75)
  probs = jnp.asarray([[0.9, 0.1], [0.2, 0.8]])
  assert metrics.accuracy(probs, jnp.asarray([1, 1])) == pytest.approx(0.5)


@pytest.mark.parametrize(
    "preds, labels, match",
    [
        (np.zeros(3), np.zeros(3, int), "rank 2"),
        (np.zeros((0, 2)), np.zeros(0, int), "empty"),
        (np.zeros((2, 0)), np.zeros(2, int), r"\(N, K\)"),
        (np.zeros((3, 2)), np.zeros(2, int), "labels must have shape"),
        (np.zeros((3, 2)), np.zeros(3), "integers"),
        (np.zeros((3, 2)), np.array([0, 1, 2]), r"\[0, 2\)"),
        (np.full((1, 2), np.nan), np.array([0]), "NaN"),
    ],
)
def test_accuracy_bad_input_raises(preds, labels, match):
  with pytest.raises(ValueError, match=match):
    metrics.accuracy(preds, labels)
