"""Contextual CSD: matches the closed form on a toy, lowers variance at data, jits."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import scipy.stats

from csd_jax import csd, models, ntk, posterior

from csd_jax import preconditioner

from csd_jax import fitting

PRIOR = models.MLPSpec(widths=(256, 256), b_std=0.5)


def _toy(seed=0):
  k1, k2, k3 = jax.random.split(jax.random.PRNGKey(seed), 3)
  x = jnp.concatenate(
      [0.4 * jax.random.normal(k1, (15, 2)) + 1.5, 0.4 * jax.random.normal(k2, (15, 2)) - 1.5]
  )
  far = jax.random.uniform(k3, (60, 2), minval=-4.0, maxval=4.0)
  return x, far


@pytest.fixture(scope="module")
def fitted():
  x, far = _toy()
  model = csd.CSD(prior=PRIOR)
  state = csd.init(model, jax.random.PRNGKey(1), x)
  state, hist = fitting.fit(
      model,
      state,
      jax.random.PRNGKey(2),
      x,
      num_steps=3000,
      batch_size=30,
      log_every=1000,
      verbose=False,
  )
  return model, state, hist, x, far


def test_loss_decreases(fitted):
  _, _, hist, _, _ = fitted
  assert hist["loss"][-1] < 0.2 * hist["loss"][0]


def test_lowers_variance_at_training_points_and_keeps_it_far_away(fitted):
  model, state, _, x, far = fitted
  v_train, _ = csd.variance(model, state, x)
  v_far, _ = csd.variance(model, state, far)
  prior_train = csd.prior_variance(model, state.prior_params, x)
  prior_far = csd.prior_variance(model, state.prior_params, far)
  assert float(jnp.median(v_train / prior_train)) < 0.02
  assert float(jnp.median(v_far / prior_far)) > 5 * float(jnp.median(v_train / prior_train))


def test_untrained_variance_is_the_prior():
  x, far = _toy()
  model = csd.CSD(prior=PRIOR)
  state = csd.init(model, jax.random.PRNGKey(1), x)
  v, neg = csd.variance(model, state, far)
  np.testing.assert_allclose(v, csd.prior_variance(model, state.prior_params, far), rtol=1e-6)
  assert int(neg) == 0


def test_ranks_like_the_last_layer_closed_form(fitted):
  model, state, _, x, far = fitted
  k = lambda a, b: ntk.last_layer_ntk(PRIOR, state.prior_params, a, b)
  v_cf = posterior.ntkgp_variance(k(x, x), k(far, x), jnp.diag(k(far, far)), 1e-4)
  v, _ = csd.variance(model, state, far)
  assert scipy.stats.spearmanr(v, v_cf)[0] > 0.9


@pytest.mark.parametrize("variant", ["aug", "ood"])
def test_context_variants_run(variant):
  x, far = _toy()
  model = csd.CSD(prior=PRIOR)
  state = csd.init(model, jax.random.PRNGKey(1), x)
  kwargs = (
      {"augment": lambda k, c: c + 0.3 * jax.random.normal(k, c.shape)}
      if variant == "aug"
      else {"context": far}
  )
  state, hist = fitting.fit(
      model,
      state,
      jax.random.PRNGKey(2),
      x,
      num_steps=200,
      batch_size=16,
      log_every=100,
      verbose=False,
      **kwargs,
  )
  v, _ = csd.variance(model, state, far)
  assert v.shape == (60,) and bool(jnp.all(jnp.isfinite(v)))
  assert hist["loss"][-1] < hist["loss"][0]


def test_free_towers_and_exact_ntk_labels():
  x, far = _toy()
  tower = models.MLPSpec(widths=(64,), b_std=0.1)
  model = csd.CSD(
      prior=models.MLPSpec(widths=(64,)),
      feature_net=tower,
      context_net=tower,
      embed_dim=32,
      label_kernel="ntk",
      optimizer=optax.adam(3e-3),
  )
  state = csd.init(model, jax.random.PRNGKey(1), x)
  v0, _ = csd.variance(model, state, x)
  np.testing.assert_allclose(v0, csd.prior_variance(model, state.prior_params, x), rtol=1e-5)
  state, _ = fitting.fit(
      model,
      state,
      jax.random.PRNGKey(2),
      x,
      num_steps=600,
      batch_size=30,
      log_every=300,
      verbose=False,
  )
  v, _ = csd.variance(model, state, x)
  assert float(jnp.median(v / v0)) < 0.2


def test_train_step_is_pure_and_changes_params():
  x, _ = _toy()
  model = csd.CSD(prior=PRIOR)
  state = csd.init(model, jax.random.PRNGKey(1), x)
  new, metrics = csd.train_step(model, state, x[:8], x[8:16])
  again, _ = csd.train_step(model, state, x[:8], x[8:16])
  assert int(new.step) == 1 and float(metrics["loss"]) > 0
  chex_equal = jax.tree_util.tree_map(np.testing.assert_array_equal, new.params, again.params)
  del chex_equal
  diff = jax.tree_util.tree_map(
      lambda a, b: float(jnp.max(jnp.abs(a - b))), new.params, state.params
  )
  assert max(jax.tree_util.tree_leaves(diff)) > 0


def test_variance_jits():
  x, far = _toy()
  model = csd.CSD(prior=PRIOR)
  state = csd.init(model, jax.random.PRNGKey(1), x)
  v, _ = jax.jit(lambda s, q: csd.variance(model, s, q))(state, far)
  np.testing.assert_allclose(v, csd.variance(model, state, far)[0], rtol=1e-6)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(x_train=jnp.ones((4,))), "x_train"),
        (dict(x_train=jnp.full((4, 2), jnp.inf)), "x_train contains NaN"),
        (dict(context=jnp.ones((4, 3))), "context"),
        (dict(num_steps=0), "num_steps"),
        (dict(extra_fraction=2.0), "extra_fraction"),
    ],
)
def test_fit_rejects_bad_input(kwargs, match):
  x, _ = _toy()
  model = csd.CSD(prior=PRIOR)
  state = csd.init(model, jax.random.PRNGKey(1), x)
  args = dict(x_train=x, num_steps=10)
  args.update(kwargs)
  with pytest.raises(ValueError, match=match):
    fitting.fit(model, state, jax.random.PRNGKey(0), verbose=False, **args)


def test_definition_validation():
  with pytest.raises(ValueError, match="label_kernel"):
    csd.CSD(prior=PRIOR, label_kernel="rbf")
  with pytest.raises(ValueError, match="feature_net"):
    csd.CSD(prior=PRIOR, label_kernel="ntk")
  assert dataclasses.replace(csd.CSD(prior=PRIOR)).tx is not None


def test_variance_relative_is_variance_over_prior(fitted):
  model, state, _, _, far = fitted
  v, _ = csd.variance(model, state, far)
  r, _ = csd.variance(model, state, far, relative=True)
  np.testing.assert_allclose(r, v / csd.prior_variance(model, state.prior_params, far), rtol=1e-5)
  assert float(r.min()) >= 0.0 and float(r.max()) <= 1.0


@pytest.mark.parametrize("precondition", [False, True])
def test_matched_fit_on_cached_features_matches_the_input_path(precondition):
  # Matched towers train on ϕ̂ rows computed once; an identity augmentation forces the path that
  # recomputes ϕ̂ from inputs at every step with the very same batches (C = X: a context set
  # would share the replacement draw with the augmentation, ``csd._sample_contexts``).
  x, far = _toy()
  model = csd.CSD(
      prior=PRIOR,
      precondition_jitter=1e-3 if precondition else 0.0,
      optimizer=optax.sgd(0.3, momentum=0.9) if precondition else None,
  )
  state = csd.init(model, jax.random.PRNGKey(1), x)
  kw = dict(num_steps=200, batch_size=16, verbose=False)
  cached, hist = fitting.fit(model, state, jax.random.PRNGKey(2), x, **kw)
  inputs, _ = fitting.fit(model, state, jax.random.PRNGKey(2), x, augment=_identity, **kw)
  np.testing.assert_allclose(
      csd.variance(model, cached, far, relative=True)[0],
      csd.variance(model, inputs, far, relative=True)[0],
      atol=1e-3,
  )
  if precondition:
    m = np.asarray(fitting.context_second_moment(model, state, x), np.float64)
    eps = hist["precondition_jitter"]
    assert (
        eps
        == preconditioner.stable_jitter(m, (csd.label_features(model, state, x), None), 16, 1e-3)
        >= 1e-3
    )
    want = np.linalg.inv(m + eps * np.trace(m) * np.eye(m.shape[0]))
    np.testing.assert_allclose(
        cached.opt_state[0].matrix, want, rtol=1e-3, atol=1e-3 * np.abs(want).max()
    )


def _identity(key, c):
  del key
  return c


def test_context_preconditioner_multiplies_only_the_context_map():
  p = jnp.asarray(np.random.default_rng(0).standard_normal((3, 3)), jnp.float32)
  g = {"context": {"params": {"linear": {"kernel": jnp.ones((3, 3))}}}, "feature": {}}
  tx = preconditioner.context_preconditioner()
  state = tx.init(g)
  np.testing.assert_array_equal(state.matrix, np.eye(3))
  out, _ = tx.update(g, preconditioner.PreconditionerState(p))
  np.testing.assert_allclose(out["context"]["params"]["linear"]["kernel"], p @ jnp.ones((3, 3)))
  assert out["feature"] == {}


def test_preconditioning_keeps_an_ood_context_from_lowering_the_variance_where_it_is_drawn():
  # Without the preconditioner, contexts with large features are learnt first (gradient
  # Σ_C (K − I) Σ_X), so an early-stopped CSD-OOD lowers V at its own contexts; with it, the
  # estimate follows X's kernel only and stays near the C = X one.
  x, far = _toy()
  opt = optax.sgd(0.3, momentum=0.9)
  kw = dict(num_steps=150, batch_size=16, context_batch_size=64, verbose=False)

  def rel_var(jitter, context):
    model = csd.CSD(prior=PRIOR, precondition_jitter=jitter, optimizer=opt)
    state = csd.init(model, jax.random.PRNGKey(1), x)
    state, _ = fitting.fit(model, state, jax.random.PRNGKey(2), x, context=context, **kw)
    return np.asarray(csd.variance(model, state, far, relative=True)[0])

  base = rel_var(1e-3, None)
  gap_plain = np.median(np.abs(rel_var(0.0, far) - base))
  gap_pre = np.median(np.abs(rel_var(1e-3, far) - base))
  assert gap_pre < 0.5 * gap_plain, (gap_pre, gap_plain)


def test_precondition_definition_checks():
  tower = models.MLPSpec(widths=(8,))
  with pytest.raises(ValueError, match="matched towers"):
    csd.CSD(prior=PRIOR, feature_net=tower, context_net=tower, precondition_jitter=1e-3)
  with pytest.raises(ValueError, match="precondition_jitter"):
    csd.CSD(prior=PRIOR, precondition_jitter=-1.0)
  x, _ = _toy()
  model = csd.CSD(prior=PRIOR)
  with pytest.raises(ValueError, match="precondition_jitter > 0"):
    preconditioner.precondition(model, csd.init(model, jax.random.PRNGKey(0), x), jnp.eye(257))


def test_stable_jitter_bounds_the_leverage_of_every_context():
  rng = np.random.default_rng(0)
  scales = np.geomspace(1.0, 1e-3, 16)  # a spectrum over 6 decades
  rows = rng.standard_normal((4000, 16)) * scales
  m = rows.T @ rows / len(rows)
  leverage = lambda eps, r: np.max(
      np.einsum("nd,de,ne->n", r, np.linalg.inv(m + eps * np.trace(m) * np.eye(16)), r)
  )
  # Gaussian rows: leverage ≈ d = 16 ≪ 2B, so the floor stands.
  assert preconditioner.stable_jitter(m, (rows,), 128, 1e-6) == 1e-6
  # One rare row along the weakest direction, 300× its typical size: ε is raised, just enough.
  odd = np.zeros((1, 16))
  odd[0, -1] = 300 * scales[-1]
  eps = preconditioner.stable_jitter(m, (rows, odd), 128, 1e-6)
  assert eps > 1e-6 and leverage(eps, odd) <= 2 * 128 < leverage(eps / 2, odd)
  with pytest.raises(ValueError, match="floor"):
    preconditioner.stable_jitter(m, (rows,), 128, 0.0)


def test_diverging_fit_says_so():
  x, _ = _toy()
  model = csd.CSD(prior=PRIOR, optimizer=optax.sgd(1e3))
  state = csd.init(model, jax.random.PRNGKey(1), x)
  with pytest.raises(FloatingPointError, match="diverged"):
    fitting.fit(model, state, jax.random.PRNGKey(2), x, num_steps=200, batch_size=16, verbose=False)
