"""RND (uncertainty_kit.baselines.rnd): the paper's shape, input normalisation, config checks."""

import jax
import numpy as np
import pytest

from csd_jax import csd
from csd_jax import models
from uncertainty_kit import data
from uncertainty_kit import methods
from uncertainty_kit import metrics
from uncertainty_kit.baselines import rnd


@pytest.fixture(scope="module")
def tiny():
  """300 training digits, 100 held-out digits, 100 uniform-noise images (28, 28, 1)."""
  mnist = data.mnist5k()
  idx = np.random.default_rng(0).permutation(len(mnist.labels))
  train_ds = data.subset(mnist, idx[:300])
  test_ds = data.subset(mnist, idx[300:400])
  noise = data.shifted(test_ds, ["uniform_noise"], seed=0)["uniform_noise"]
  return train_ds, test_ds, noise


def _config(steps=60, **over):
  """RND's defaults on a short shared budget (the classifier for ``predict`` trains 20 steps)."""
  return methods.config_for(
      "rnd",
      {"train": {"num_steps": 20, "batch_size": 32}, "num_steps": steps, "batch_size": 64, **over},
  )


def test_default_is_the_paper_shape():
  pred, target = rnd.specs(methods.config_for("rnd"))
  torso = tuple(tuple(c) for c in methods.config_for("rnd")["backbone"]["convs"])
  assert pred.convs == target.convs == torso
  assert pred.widths == (256, 256) and target.widths == (256,)
  assert pred.out_dim == target.out_dim == 256
  config = methods.config_for("rnd")
  assert config["lr"] == 3e-3 and config["anneal"] == "linear"
  assert config["normalize_inputs"] != "none"
  # No own budget by default: the shared one.
  assert rnd.budget(config) == {
      "num_steps": config["train"]["num_steps"],
      "batch_size": config["train"]["batch_size"],
  }
  # The earlier shape stays reachable: both nets the full backbone with a 64-d head.
  pred, target = rnd.specs(methods.config_for("rnd", rnd.LEGACY_SHAPE))
  assert pred.widths == target.widths == (128,) and pred.out_dim == 64


def test_fit_scores_noise_above_training_and_held_out_digits(tiny):
  train_ds, test_ds, noise = tiny
  state = methods.get("rnd").fit(jax.random.PRNGKey(0), train_ds, _config())
  score = jax.jit(methods.get("rnd").score)
  s_train = np.asarray(score(state, train_ds.images[:100]))
  s_test = np.asarray(score(state, test_ds.images))
  s_noise = np.asarray(score(state, noise.images))
  assert s_train.shape == (100,) and np.all(np.isfinite(s_train))
  assert metrics.ood_metrics(s_train, s_noise)["auroc"] > 0.95
  assert metrics.ood_metrics(s_test, s_noise)["auroc"] > 0.95
  # The fit lowered the error on digits: the predictor at its init scores them far higher.
  pred_spec, _ = rnd.specs(state.config)
  init = models.module(pred_spec).init(
      jax.random.split(jax.random.PRNGKey(0), 3)[1], train_ds.images[:1]
  )
  early = state.replace(arrays={**state.arrays, "predictor": init})
  assert np.median(s_train) < 0.5 * np.median(np.asarray(score(early, train_ds.images[:100])))


@pytest.mark.parametrize("mode", csd.INPUT_NORMS)
def test_input_statistics_are_stored(tiny, mode):
  images = np.asarray(tiny[0].images)
  mean, std = csd.input_stats(images, mode)
  assert mean.shape == std.shape == images.shape[1:]
  if mode == "pixel":
    np.testing.assert_allclose(mean, images.mean(0), atol=1e-6)
    np.testing.assert_allclose(std, np.maximum(images.std(0), csd.STD_FLOOR), rtol=1e-5)
  elif mode == "global":
    np.testing.assert_allclose(mean, np.full(mean.shape, images.mean()), rtol=1e-5)
    np.testing.assert_allclose(std, np.full(std.shape, images.std()), rtol=1e-4)
  else:
    np.testing.assert_array_equal(mean, 0.0)
    np.testing.assert_array_equal(std, 1.0)


def test_score_applies_the_stored_normalisation(tiny):
  """With global statistics, fitting on a·x + b and scoring a·x' + b gives x's scores: the state's
  μ, σ undo the affine map in both fit and score. Changing the stored μ changes the score."""
  train_ds, test_ds, noise = tiny
  config = _config(normalize_inputs="global")  # same compiled step as the default fit
  method = methods.get("rnd")
  queries = np.concatenate([test_ds.images[:20], noise.images[:20]])
  state = method.fit(jax.random.PRNGKey(1), train_ds, config)
  shifted = train_ds._replace(images=3.0 * train_ds.images + 2.0)
  state_shifted = method.fit(jax.random.PRNGKey(1), shifted, config)
  np.testing.assert_allclose(
      state_shifted.arrays["input_mean"], 3.0 * state.arrays["input_mean"] + 2.0, rtol=1e-5
  )
  score = jax.jit(method.score)  # one program for the three states
  a = np.asarray(score(state, queries))
  b = np.asarray(score(state_shifted, 3.0 * queries + 2.0))
  np.testing.assert_allclose(b, a, rtol=2e-2, atol=1e-6 * np.abs(a).max())
  moved = state.replace(arrays={**state.arrays, "input_mean": state.arrays["input_mean"] + 1.0})
  assert not np.allclose(np.asarray(score(moved, queries)), a, rtol=1e-2)


@pytest.mark.parametrize(
    "key,value",
    [
        ("predictor_widths", []),
        ("predictor_widths", [256, 0]),
        ("target_widths", [-1]),
        ("target_widths", 256),
        ("out_dim", 0),
        ("out_dim", 2.5),
        ("lr", 0.0),
        ("lr", "fast"),
        ("anneal", "exponential"),
        ("weight_decay", -1.0),
        ("normalize_inputs", True),
        ("normalize_inputs", "batch"),
        ("clip", 0.0),
        ("num_steps", 0),
        ("batch_size", -4),
    ],
)
def test_bad_config_names_the_key(tiny, key, value):
  config = methods.config_for("rnd", {key: value})
  with pytest.raises(ValueError, match=repr(key)):
    rnd.check_config(config)
  with pytest.raises(ValueError, match=repr(key)):  # before any training
    methods.get("rnd").fit(jax.random.PRNGKey(0), tiny[0], config)
