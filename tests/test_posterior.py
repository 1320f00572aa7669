"""Closed-form variances: direct solve, neural-tangents, positivity, clear errors."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from csd_jax import _nt_compat, models, ntk, posterior

SPEC = models.MLPSpec(widths=(128, 128), b_std=0.3)


def _kernels(n=12, m=7, seed=0):
  x = jax.random.normal(jax.random.PRNGKey(seed), (n, 3))
  q = 2.0 * jax.random.normal(jax.random.PRNGKey(seed + 1), (m, 3))
  get = ("ntk", "nngp")
  return (
      x,
      q,
      ntk.infinite_kernels(SPEC, x, None, get),
      ntk.infinite_kernels(SPEC, q, x, get),
      ntk.infinite_kernels(SPEC, q, None, get),
  )


def test_ntkgp_variance_equals_dense_solve(x64):
  _, _, ktr, kte, ktt = _kernels()
  v = posterior.ntkgp_variance(ktr.ntk, kte.ntk, jnp.diag(ktt.ntk))
  ref = jnp.diag(ktt.ntk) - jnp.einsum("mn,mn->m", kte.ntk, jnp.linalg.solve(ktr.ntk, kte.ntk.T).T)
  np.testing.assert_allclose(v, ref, rtol=1e-8, atol=1e-12)
  assert bool(jnp.all(v >= 0))
  assert bool(jnp.all(v <= jnp.diag(ktt.ntk) + 1e-12))


@pytest.mark.parametrize("diag_reg", [0.0, 1e-3])
def test_matches_neural_tangents_gp_inference(x64, diag_reg):
  _, _, ktr, kte, ktt = _kernels()
  nt = _nt_compat.nt()
  pred = nt.predict.gp_inference(ktr, jnp.zeros((ktr.ntk.shape[0], 1)), diag_reg=diag_reg)
  out = pred(get=("ntkgp", "ntk"), k_test_train=kte, k_test_test=ktt)
  v_ntkgp = posterior.ntkgp_variance(ktr.ntk, kte.ntk, jnp.diag(ktt.ntk), diag_reg)
  v_std = posterior.standard_ensemble_variance(
      ktr.ntk, kte.ntk, ktr.nngp, kte.nngp, jnp.diag(ktt.nngp), diag_reg
  )
  np.testing.assert_allclose(v_ntkgp, jnp.diag(out.ntkgp.covariance), rtol=1e-9)
  np.testing.assert_allclose(v_std, jnp.diag(out.ntk.covariance), rtol=1e-8)
  # The two ensembles really are different covariances.
  assert float(jnp.max(jnp.abs(v_std - v_ntkgp) / v_ntkgp)) > 1e-2


def test_standard_ensemble_matches_gradient_descent_mse_ensemble(x64):
  x, q, *_ = _kernels()
  nt = _nt_compat.nt()
  _, _, kernel_fn = models.stax_layers(SPEC)
  pred = nt.predict.gradient_descent_mse_ensemble(kernel_fn, x, jnp.zeros((x.shape[0], 1)))
  cov = pred(None, q, get="ntk", compute_cov=True).covariance
  get = ("ntk", "nngp")
  ktr = kernel_fn(x, None, get)
  kte = kernel_fn(q, x, get)
  v = posterior.standard_ensemble_variance(
      ktr.ntk, kte.ntk, ktr.nngp, kte.nngp, jnp.diag(kernel_fn(q, None, "nngp"))
  )
  np.testing.assert_allclose(v, jnp.diag(cov), rtol=1e-6)


def test_variance_vanishes_at_training_points(x64):
  x, _, ktr, _, _ = _kernels()
  v = posterior.ntkgp_variance(ktr.ntk, ktr.ntk, jnp.diag(ktr.ntk))
  assert float(jnp.max(v / jnp.diag(ktr.ntk))) < 1e-8


def test_chunked_function_form_matches_dense(x64):
  x, q, ktr, kte, ktt = _kernels(m=11)
  _, _, kernel_fn = models.stax_layers(SPEC)
  v = posterior.ntkgp_variance_fn(lambda a, b: kernel_fn(a, b, "ntk"), x, q, 1e-6, chunk_size=4)
  ref = posterior.ntkgp_variance(ktr.ntk, kte.ntk, jnp.diag(ktt.ntk), 1e-6)
  np.testing.assert_allclose(v, ref, rtol=1e-6)
  assert v.shape == (11,)


def test_singular_gram_escalates_jitter_then_fails_clearly(x64):
  x = jnp.ones((4, 3))  # four copies of one point: rank 1
  k = ntk.infinite_kernels(SPEC, x, None, "ntk")
  # Without escalation: a clear error, not NaN.
  with pytest.raises(posterior.NotPositiveDefiniteError, match="diag_reg=0.0"):
    posterior.ntkgp_variance(k, k, jnp.diag(k), max_diag_reg=0.0)
  # With it (the default): a warning naming the jitter used, and finite variances in [0, prior].
  with pytest.warns(posterior.JitterWarning, match="used jitter"):
    v = posterior.ntkgp_variance(k, k, jnp.diag(k))
  assert bool(jnp.all(jnp.isfinite(v))) and bool(jnp.all((v >= 0) & (v <= jnp.diag(k))))
  f = posterior.factor(k, 0.0, check=False)
  assert 0.0 < float(f.jitter) <= posterior.DEFAULT_MAX_DIAG_REG and bool(f.ok)
  # A requested diag_reg that is large enough needs no escalation and warns nothing.
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    posterior.ntkgp_variance(k, k, jnp.diag(k), diag_reg=1e-6)


def test_indefinite_gram_fails_after_the_jitter_limit(x64):
  k = jnp.diag(jnp.array([1.0, 1.0, -1e-2]))  # indefinite beyond any jitter <= 1e-4
  with pytest.raises(posterior.NotPositiveDefiniteError, match="max_diag_reg=0.0001"):
    posterior.ntkgp_variance(k, k, jnp.diag(k))
  with pytest.raises(posterior.NotPositiveDefiniteError):
    posterior.ntkgp_variance_fn(
        lambda a, b: a @ b.T,
        jnp.eye(3) * jnp.array([1, 1, 0.0]),
        jnp.ones((2, 3)),
        max_diag_reg=0.0,
    )
  # Under an outer jit nothing can raise: the factor reports failure through ``ok``.
  f = jax.jit(lambda m: posterior.factor(m, 0.0, check=False))(k)
  assert not bool(f.ok)


def test_jitter_escalation_under_jit(x64):
  x = jnp.ones((4, 3))
  k = ntk.infinite_kernels(SPEC, x, None, "ntk")
  v = jax.jit(lambda m: posterior.ntkgp_variance(m, m, jnp.diag(m)))(k)
  assert bool(jnp.all(jnp.isfinite(v)))


def test_jits(x64):
  _, _, ktr, kte, ktt = _kernels()
  f = jax.jit(lambda a, b, c: posterior.ntkgp_variance(a, b, c, 1e-6))
  np.testing.assert_allclose(
      f(ktr.ntk, kte.ntk, jnp.diag(ktt.ntk)),
      posterior.ntkgp_variance(ktr.ntk, kte.ntk, jnp.diag(ktt.ntk), 1e-6),
      rtol=1e-10,
  )


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(k_train_train=jnp.ones((3, 4))), "square"),
        (dict(k_test_train=jnp.ones((2, 5))), "columns"),
        (dict(k_test_test_diag=jnp.ones((3,))), "entries"),
        (dict(k_test_train=jnp.full((2, 4), jnp.nan)), "k_test_train contains NaN"),
        (dict(diag_reg=-1.0), "diag_reg"),
        (dict(max_diag_reg=-1.0), "max_diag_reg"),
    ],
)
def test_bad_inputs_name_the_argument(kwargs, match):
  args = dict(
      k_train_train=jnp.eye(4), k_test_train=jnp.ones((2, 4)), k_test_test_diag=jnp.ones((2,))
  )
  args.update(kwargs)
  with pytest.raises(ValueError, match=match):
    posterior.ntkgp_variance(**args)


@pytest.mark.parametrize("n, d", [(40, 8), (6, 20)])
def test_primal_form_matches_the_gram_form(x64, n, d):
  rng = np.random.default_rng(0)
  phi = jnp.asarray(rng.standard_normal((n, d)))
  q = jnp.asarray(3.0 * rng.standard_normal((15, d)))
  want = posterior.ntkgp_variance(phi @ phi.T, q @ phi.T, jnp.sum(q * q, -1), 1e-3)
  got = posterior.ntkgp_variance_from_features(phi, q, 1e-3)
  np.testing.assert_allclose(got, want, rtol=1e-8, atol=1e-10)
  with pytest.raises(ValueError, match="diag_reg > 0"):
    posterior.ntkgp_variance_from_features(phi, q, 0.0)
  with pytest.raises(ValueError, match="features"):
    posterior.ntkgp_variance_from_features(phi, q[:, :3], 1e-3)
