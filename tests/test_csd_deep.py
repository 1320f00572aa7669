"""The deep CSD form (csd.CSD.deep): normalised towers, diagonal-weighted pair loss, paired
contexts, and the 1 − cos score."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import scipy.stats

from csd_jax import csd, models, posterior

from csd_jax import fitting
from validation.problems import toy_2d

PRIOR = models.MLPSpec(widths=(128,), b_std=0.5)
TOWER = models.MLPSpec(widths=(64, 64))


def _model(shared=False, **kw):
  return csd.CSD(
      prior=PRIOR,
      feature_net=TOWER,
      context_net=None if shared else TOWER,
      embed_dim=32,
      normalize=True,
      loss_weighting="diagonal",
      shared_torso=shared,
      optimizer=optax.adam(3e-3, eps=1e-5),
      **kw,
  )


def _toy(seed=0):
  """Two clusters of 60 points (validation.problems.toy_2d) and 200 queries over [−4, 4]²."""
  toy = toy_2d(seed, n_per_cluster=60, num_queries=200)
  return (jnp.asarray(toy["x_train"], jnp.float32), jnp.asarray(toy["x_query"], jnp.float32))


@pytest.fixture(scope="module", params=[False, True], ids=["separate", "shared"])
def fitted(request):
  x, far = _toy()
  model = _model(shared=request.param)
  state = csd.init(model, jax.random.PRNGKey(1), x)
  state, hist = fitting.fit(
      model,
      state,
      jax.random.PRNGKey(2),
      x,
      num_steps=600,
      batch_size=64,
      log_every=300,
      verbose=False,
  )
  return model, state, hist, x, far


def test_pair_loss_weighs_diagonal_as_much_as_the_rest():
  pred = jnp.zeros((3, 3))
  labels = jnp.array([[1.0, 2.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
  # diagonal errors 1, 1, 1 (mean 1); off-diagonal: one error of 4 among 6 (mean 2/3).
  np.testing.assert_allclose(csd.pair_loss(pred, labels, "diagonal"), 0.5 * (1.0 + 4.0 / 6))
  np.testing.assert_allclose(csd.pair_loss(pred, labels, "block"), 0.5 * 7.0 / 9)
  with pytest.raises(ValueError, match="square"):
    csd.pair_loss(jnp.zeros((2, 3)), jnp.zeros((2, 3)), "diagonal")
  with pytest.raises(ValueError, match="weighting"):
    csd.pair_loss(pred, labels, "mean")


def test_normalised_g_is_a_cosine_and_labels_are_cosines():
  x, _ = _toy()
  model = _model()
  state = csd.init(model, jax.random.PRNGKey(0), x)
  emb_x, emb_c = csd._embeddings(model, state, state.params, x, x)
  g = emb_x @ emb_c.T
  assert float(jnp.max(jnp.abs(g))) <= 1.0 + 1e-5
  labels = csd.label_block(model, state.prior_params, x, x)
  np.testing.assert_allclose(jnp.diagonal(labels), 1.0, rtol=1e-5)
  # the relative score is 1 − cos at the diagonal: in [0, 2]
  rel, _ = csd.variance(model, state, x, relative=True)
  np.testing.assert_allclose(rel, 1.0 - jnp.diagonal(g), atol=1e-5)


def test_paired_contexts_put_each_input_on_the_diagonal():
  x, _ = _toy()
  model = _model()
  bx, bc = csd.sample_batch(model, jax.random.PRNGKey(0), x, None, None, 16, 16, 0.5)
  np.testing.assert_array_equal(bx, bc)  # C = X: c_i = x_i
  extra = 100.0 + x
  bx, bc = csd.sample_batch(model, jax.random.PRNGKey(0), x, extra, None, 64, 64, 0.5)
  replaced = np.asarray(jnp.any(bc != bx, axis=-1))
  assert 10 < replaced.sum() < 54  # about half replaced by extra rows
  assert np.all(np.asarray(bc[replaced]) > 50.0)
  with pytest.raises(ValueError, match="context_batch_size"):
    csd.sample_batch(model, jax.random.PRNGKey(0), x, None, None, 16, 8, 0.5)


def test_deep_fit_lowers_variance_at_training_points(fitted):
  model, state, hist, x, far = fitted
  assert hist["loss"][-1] < 0.5 * hist["loss"][0]
  rel_x, _ = csd.variance(model, state, x, relative=True)
  rel_far, _ = csd.variance(model, state, far, relative=True)
  noise = 6.0 * jax.random.normal(jax.random.PRNGKey(5), (200, 2))
  rel_noise, _ = csd.variance(model, state, noise, relative=True)
  assert float(jnp.median(rel_x)) < 0.5 * float(jnp.median(rel_far))
  assert float(jnp.median(rel_x)) < 0.5 * float(jnp.median(rel_noise))


def test_deep_fit_ranks_like_the_closed_form_of_its_label_kernel(fitted):
  model, state, _, x, far = fitted
  unit = lambda z: csd._unit(models.last_layer_features(PRIOR, state.prior_params, z))
  exact = posterior.ntkgp_variance_from_features(unit(x), unit(far), 1e-6 * x.shape[0])
  rel, _ = csd.variance(model, state, far, relative=True)
  assert scipy.stats.spearmanr(rel, exact)[0] > 0.8


def test_scaled_score_is_prior_times_relative(fitted):
  model, state, _, _, far = fitted
  v, _ = csd.variance(model, state, far)
  rel, _ = csd.variance(model, state, far, relative=True)
  np.testing.assert_allclose(
      v, rel * csd.prior_variance(model, state.prior_params, far), rtol=1e-4, atol=1e-6
  )


def test_deep_definition_errors_name_the_argument():
  with pytest.raises(ValueError, match="loss_weighting"):
    csd.CSD(prior=PRIOR, feature_net=TOWER, context_net=TOWER, loss_weighting="sum")
  with pytest.raises(ValueError, match="normalize"):
    csd.CSD(prior=PRIOR, normalize=True)
  with pytest.raises(ValueError, match="shared_torso"):
    csd.CSD(
        prior=PRIOR, feature_net=TOWER, context_net=models.MLPSpec(widths=(8,)), shared_torso=True
    )
  x, _ = _toy()
  model = _model()
  state = csd.init(model, jax.random.PRNGKey(0), x)
  with pytest.raises(ValueError, match="same batch size"):
    csd.train_step(model, state, x[:8], x[:4])
  with pytest.raises(ValueError, match="x has per-example shape"):
    csd.variance(model, state, jnp.zeros((4, 3)))
  with pytest.raises(ValueError, match=r"x has per-example shape \(5,\)"):  # 3 + 2 actions
    csd.variance(model, state, models.OneHotProduct(jnp.zeros((4, 3)), 2))
