"""The validation binaries (quick mode, in-process) and the single-query theorem, fast.

Each ``validation.<name>.run(out_dir, quick=True)`` must write ``<name>.json`` with the
documented keys and a plot. The binaries switch float64 on globally; the ``restore_x64``
fixture puts the flag back so later tests see the default.
"""

import json
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from csd_jax import models, ntk, single_query


@pytest.fixture
def restore_x64():
  before = jax.config.read("jax_enable_x64")
  yield
  jax.config.update("jax_enable_x64", before)


def _load(out_dir, name):
  path = os.path.join(out_dir, f"{name}.json")
  assert os.path.exists(path), path
  assert any(f.startswith(name) and f.endswith(".png") for f in os.listdir(out_dir))
  with open(path) as f:
    return json.load(f)


# ----------------------------------------------------------------------------------------------
# The single-query theorem (library API), fast.
# ----------------------------------------------------------------------------------------------


def _random_features(seed=0, num_features=128, dim=3):
  rng = np.random.default_rng(seed)
  w_in = jnp.asarray(rng.normal(size=(dim, num_features)))
  b_in = jnp.asarray(0.1 * rng.normal(size=(num_features,)))

  def apply_fn(params, x):
    phi = jax.nn.relu(x @ w_in / math.sqrt(dim) + b_in) * math.sqrt(2.0 / num_features)
    return (phi @ params["w"])[:, None]

  return apply_fn, {"w": jnp.asarray(rng.normal(size=(num_features,)))}


def test_single_query_theorem_linear_model(x64):
  """A model linear in its parameters: g → Θ(x,X)Θ(X,X)⁻¹Θ(X,x_t) to optimiser tolerance."""
  apply_fn, params0 = _random_features()
  rng = np.random.default_rng(1)
  x = jnp.asarray(rng.normal(size=(6, 3)))
  xq = jnp.asarray(rng.normal(size=(4, 3)) * 2.0)
  xe = jnp.concatenate([x, xq])
  k = np.asarray(ntk.jacobian_ntk(apply_fn, params0, xe))
  n = x.shape[0]
  for t in range(xq.shape[0]):
    labels = jnp.asarray(k[:n, n + t])
    params = single_query.fit_single_query(apply_fn, params0, x, labels, num_steps=20_000)
    g = np.asarray(single_query.single_query_predict(apply_fn, params, params0, xe))
    want = k[:, :n] @ np.linalg.solve(k[:n, :n], k[:n, n + t])
    np.testing.assert_allclose(g, want, rtol=0, atol=1e-6 * np.abs(want).max())
    # V(x_t) = Θ(x_t, x_t) − g(x_t) is the closed-form variance.
    v = k[n + t, n + t] - g[n + t]
    v_cf = k[n + t, n + t] - k[n + t, :n] @ np.linalg.solve(k[:n, :n], k[:n, n + t])
    assert abs(v - v_cf) <= 1e-6 * k[n + t, n + t]


def test_single_query_api_is_centred_vmappable_and_accepts_a_learning_rate(x64):
  net = models.module(models.MLPSpec(widths=(16, 16)))
  x = jax.random.normal(jax.random.PRNGKey(0), (5, 2))
  params0 = net.init(jax.random.PRNGKey(1), x[:1])
  np.testing.assert_array_equal(single_query.single_query_predict(net.apply, params0, params0, x), 0.0)
  labels = jax.random.normal(jax.random.PRNGKey(2), (3, 5))
  fit = jax.vmap(lambda y: single_query.fit_single_query(net.apply, params0, x, y, num_steps=5,
                                                learning_rate=0.01))
  params = fit(labels)
  assert jax.tree_util.tree_leaves(params)[0].shape[0] == 3
  with pytest.raises(ValueError, match="one output per example"):
    wide = models.module(models.MLPSpec(widths=(4,), out_dim=2))
    p = wide.init(jax.random.PRNGKey(0), x[:1])
    single_query.fit_single_query(wide.apply, p, x, labels[0], num_steps=1)


def test_closed_form_relu_ntk_handles_parallel_inputs(x64):
  """The validation closed form is exact where arccos loses digits (x and 1e-3 x)."""
  from validation import ntk_check
  x = np.random.default_rng(0).normal(size=(3, 4))
  x = np.concatenate([x, 1e-3 * x[:1]])
  k, _ = ntk_check.closed_form_mlp_kernels(x, x, depth=1, w_std=math.sqrt(2.0), b_std=None)
  # One hidden ReLU layer, no bias: Θ(x, x') = 2 · 2 x·x'/d for parallel x, x'.
  assert k[0, 3] == pytest.approx(4.0 * x[0] @ x[3] / 4, rel=1e-14)
  assert k[0, 0] == pytest.approx(4.0 * x[0] @ x[0] / 4, rel=1e-14)


def test_factorised_mlp_ntk_matches_empirical_ntk(x64):
  from validation import common
  spec = models.MLPSpec(widths=(24, 24), out_dim=2, b_std=0.3)
  net = models.module(spec)
  x1 = jax.random.normal(jax.random.PRNGKey(0), (5, 3))
  x2 = jax.random.normal(jax.random.PRNGKey(1), (4, 3))
  params = net.init(jax.random.PRNGKey(2), x1)
  np.testing.assert_allclose(common.mlp_empirical_ntk(spec, params, x1, x2),
                             ntk.empirical_ntk(net.apply, params, x1, x2), rtol=1e-12)


# ----------------------------------------------------------------------------------------------
# Each binary's quick mode, in-process.
# ----------------------------------------------------------------------------------------------


def test_ntk_check_quick(tmp_path, restore_x64):
  from validation import ntk_check
  ntk_check.run(str(tmp_path), quick=True)
  r = _load(tmp_path, "ntk_check")
  assert r["empirical_vs_jacobian_max_rel_err"] <= 1e-10
  assert r["infinite_vs_closed_form_max_rel_err"] <= 1e-10
  assert all({"width", "rel_err"} <= set(row) for row in r["width_sweep"])
  assert len(r["width_sweep"]) >= 2


def test_single_query_quick(tmp_path, restore_x64):
  from validation import single_query
  single_query.run(str(tmp_path), quick=True)
  r = _load(tmp_path, "single_query")
  assert r["linear_model_rel_err"] <= 1e-6
  rows = r["rel_err_by_width"]
  assert all({"width", "rel_err"} <= set(row) for row in rows) and len(rows) >= 2
  assert all(0 < row["rel_err"] < 0.2 for row in rows)


@pytest.mark.parametrize("extras", [
    False,
    # The extra ensembles (centred prior, y ≡ 0) and two CSD fits take ~2/3 of the quick run.
    pytest.param(True, marks=pytest.mark.slow)])
def test_ensemble_quick(tmp_path, restore_x64, extras):
  from validation import ensemble
  ensemble.run(str(tmp_path), quick=True, extras=extras)
  r = _load(tmp_path, "ensemble")
  for key in ("rel_err", "members", "width", "mc_floor", "rel_err_by_members"):
    assert key in r, key
  assert r["mc_floor"] == pytest.approx(math.sqrt(2.0 / (r["members"] - 1)))
  assert all({"members", "rel_err", "mc_floor"} <= set(row) for row in r["rel_err_by_members"])
  assert np.isfinite(r["rel_err"])
  for key in ("centred_prior_form", "zero_targets", "csd"):
    assert (key in r) == extras, key


def test_contextual_quick(tmp_path, restore_x64):
  from validation import contextual
  contextual.run(str(tmp_path), quick=True)
  r = _load(tmp_path, "contextual")
  for name in ("toy_1d", "toy_2d", "mnist"):
    assert name in r, name
  variants = [(n, v) for n in ("toy_1d", "toy_2d", "mnist") for v in contextual.ALL_VARIANTS
              if v in r[n]]
  assert ("toy_1d", "csd") in variants
  for n, v in variants:
    for split in ("overall", "in_dist", "off_dist"):
      assert {"spearman", "median_norm_abs_err"} <= set(r[n][v][split]), (n, v, split)
  assert "summary" in r
