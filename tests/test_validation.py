"""The validation binaries (small configs, in-process) and the single-query theorem, fast.

Each ``validation.<name>.run(config, out_dir)`` must write ``<name>.json`` with the documented
keys and a plot. The binaries switch float64 on globally; the fixtures put the flag back so
later tests see the default. Each binary runs once per module (a module-scoped fixture) and
several tests read its result (the file runs on one xdist worker: ``--dist loadfile``).
"""

import json
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import configs.contextual
import configs.ensemble
import configs.ntk_check
import configs.single_query
from csd_jax import models, ntk, single_query
from cmdline import cli
from validation import agreement
from validation import contextual
from validation import ensemble
from validation import factorised_ntk
from validation import ntk_check
from validation import single_query as single_query_binary


def _load(out_dir, name):
  path = os.path.join(out_dir, f"{name}.json")
  assert os.path.exists(path), path
  assert any(f.startswith(name) and f.endswith(".png") for f in os.listdir(out_dir))
  with open(path) as f:
    return json.load(f)


def _run_once(binary, config, tmp_path_factory):
  """Runs ``binary.run(config, dir)`` with float64 restored afterwards; returns the JSON."""
  before = jax.config.read("jax_enable_x64")
  out_dir = str(tmp_path_factory.mktemp(binary.NAME))
  try:
    binary.run(config, out_dir)
  finally:
    jax.config.update("jax_enable_x64", before)
  return _load(out_dir, binary.NAME)


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


def test_spearman_is_undefined_for_a_constant_array():
  assert math.isnan(agreement.spearman(np.zeros(5), np.arange(5.0)))
  assert agreement.spearman(np.arange(5.0), np.arange(5.0) ** 3) == pytest.approx(1.0)
  assert agreement.spearman(np.arange(5.0), -np.arange(5.0)) == pytest.approx(-1.0)


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
  np.testing.assert_array_equal(
      single_query.single_query_predict(net.apply, params0, params0, x), 0.0
  )
  labels = jax.random.normal(jax.random.PRNGKey(2), (3, 5))
  fit = jax.vmap(
      lambda y: single_query.fit_single_query(
          net.apply, params0, x, y, num_steps=5, learning_rate=0.01
      )
  )
  params = fit(labels)
  assert jax.tree_util.tree_leaves(params)[0].shape[0] == 3
  with pytest.raises(ValueError, match="one output per example"):
    wide = models.module(models.MLPSpec(widths=(4,), out_dim=2))
    p = wide.init(jax.random.PRNGKey(0), x[:1])
    single_query.fit_single_query(wide.apply, p, x, labels[0], num_steps=1)


def test_closed_form_relu_ntk_handles_parallel_inputs(x64):
  """The validation closed form is exact where arccos loses digits (x and 1e-3 x)."""
  x = np.random.default_rng(0).normal(size=(3, 4))
  x = np.concatenate([x, 1e-3 * x[:1]])
  k, _ = ntk_check.closed_form_mlp_kernels(x, x, depth=1, w_std=math.sqrt(2.0), b_std=None)
  # One hidden ReLU layer, no bias: Θ(x, x') = 2 · 2 x·x'/d for parallel x, x'.
  assert k[0, 3] == pytest.approx(4.0 * x[0] @ x[3] / 4, rel=1e-14)
  assert k[0, 0] == pytest.approx(4.0 * x[0] @ x[0] / 4, rel=1e-14)


def test_factorised_mlp_ntk_matches_empirical_ntk(x64):
  spec = models.MLPSpec(widths=(24, 24), out_dim=2, b_std=0.3)
  net = models.module(spec)
  x1 = jax.random.normal(jax.random.PRNGKey(0), (5, 3))
  x2 = jax.random.normal(jax.random.PRNGKey(1), (4, 3))
  params = net.init(jax.random.PRNGKey(2), x1)
  np.testing.assert_allclose(
      factorised_ntk.mlp_empirical_ntk(spec, params, x1, x2),
      ntk.empirical_ntk(net.apply, params, x1, x2),
      rtol=1e-12,
  )


# ----------------------------------------------------------------------------------------------
# Configs.
# ----------------------------------------------------------------------------------------------


BINARIES = {
    "ntk_check": (ntk_check, configs.ntk_check),
    "single_query": (single_query_binary, configs.single_query),
    "ensemble": (ensemble, configs.ensemble),
    "contextual": (contextual, configs.contextual),
}


@pytest.mark.parametrize("name", sorted(BINARIES))
def test_every_profile_passes_its_checks(name):
  binary, config = BINARIES[name]
  for profile in (None, "quick"):
    binary.check_config(config.get_config(profile))
  with pytest.raises(ValueError, match="profiles"):
    config.get_config("no_such_profile")


@pytest.mark.parametrize(
    "name, field, value, message",
    [
        ("ntk_check", "empirical_specs", "cnn,resnet", r"--config\.empirical_specs .* got resnet"),
        ("ntk_check", "sweep_widths", (64,), r"--config\.sweep_widths must be two or more"),
        ("single_query", "label_scales", (0.1, 0.0), r"--config\.label_scales must be positive"),
        ("ensemble", "members", 1, r"--config\.members must be >= 2"),
        ("contextual", "toy_2d.variants", "csd,nope", r"--config\.toy_2d\.variants .* got nope"),
        ("contextual", "toy_1d.variants", "csd_long", r"csd_long needs a --config\.toy_1d\.steps"),
    ],
)
def test_a_bad_config_fails_before_any_work_naming_the_field(tmp_path, name, field, value, message):
  binary, config_module = BINARIES[name]
  config = config_module.get_config("quick")
  *parents, leaf = field.split(".")
  target = cli.lookup(config, ".".join(parents)) if parents else config
  target[leaf] = value
  with pytest.raises(cli.ConfigError, match=message):
    binary.run(config, str(tmp_path))
  assert not os.listdir(tmp_path)


# ----------------------------------------------------------------------------------------------
# Each binary on a small config, in-process.
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ntk_check_result(tmp_path_factory):
  config = configs.ntk_check.get_config("quick")
  config.infinite_depths = (2,)  # depth 1 without biases: test_closed_form_relu_ntk_handles_…
  return _run_once(ntk_check, config, tmp_path_factory)


def test_ntk_check_kernels_agree_with_the_references(ntk_check_result):
  r = ntk_check_result
  assert r["empirical_vs_jacobian_max_rel_err"] <= 1e-10
  assert r["infinite_vs_closed_form_max_rel_err"] <= 1e-10
  assert r["infinite_nngp_vs_closed_form_max_rel_err"] <= 1e-10
  assert (
      "mlp_relu_ntk_3out/factorised_ntk.mlp_empirical_ntk" in r["details"]["empirical_vs_jacobian"]
  )


def test_ntk_check_finite_width_error_falls_with_width(ntk_check_result):
  r = ntk_check_result
  assert [row["width"] for row in r["width_sweep"]] == [64, 256]
  assert r["width_sweep"][1]["rel_err"] < r["width_sweep"][0]["rel_err"]
  assert r["width_sweep_loglog_slope"] < -0.3  # ∝ width^-1/2 in expectation
  assert r["config"]["sweep_widths"] == [64, 256]


@pytest.fixture(scope="module")
def single_query_result(tmp_path_factory):
  config = configs.single_query.get_config("quick")
  config.widths = (64, 256)
  config.erf_widths = (64,)
  return _run_once(single_query_binary, config, tmp_path_factory)


def test_single_query_is_exact_for_a_linear_model(single_query_result):
  assert single_query_result["linear_model_rel_err"] <= 1e-6


def test_single_query_wide_nets_are_close_and_small_labels_closer(single_query_result):
  r = single_query_result
  rows = r["rel_err_by_width"]
  assert [row["width"] for row in rows] == [64, 256]
  assert all(0 < row["rel_err"] < 0.2 for row in rows)
  assert 0 < r["rel_err_by_width_erf"][0]["rel_err"] < 0.2
  # the theorem is a small-label (lazy) statement: labels 10x smaller, a much smaller error
  small, unit = r["rel_err_by_label_scale"]
  assert (small["label_scale"], unit["label_scale"]) == (0.1, 1.0)
  assert small["rel_err"] < 0.2 * unit["rel_err"]


def _small_ensemble(extras):
  config = configs.ensemble.get_config("quick")
  config.members = 16
  config.extras = extras
  return config


@pytest.mark.parametrize(
    "extras",
    [
        False,
        # The extra ensembles (centred prior, y ≡ 0) and two CSD fits take ~2/3 of the run.
        pytest.param(True, marks=pytest.mark.slow),
    ],
)
def test_ensemble_variance_is_near_the_closed_form(tmp_path_factory, extras):
  r = _run_once(ensemble, _small_ensemble(extras), tmp_path_factory)
  for key in ("rel_err", "members", "width", "mc_floor", "rel_err_by_members"):
    assert key in r, key
  assert r["members"] == 16
  assert r["mc_floor"] == pytest.approx(math.sqrt(2.0 / (r["members"] - 1)))
  assert all({"members", "rel_err", "mc_floor"} <= set(row) for row in r["rel_err_by_members"])
  # a sample variance of 16 draws: its relative error is about the Monte Carlo floor
  assert 0.3 * r["mc_floor"] < r["rel_err"] < 2.0 * r["mc_floor"]
  for key in ("centred_prior_form", "zero_targets", "csd"):
    assert (key in r) == extras, key


@pytest.fixture(scope="module")
def contextual_result(tmp_path_factory):
  """The two toys, three variants (matched, CSD-Aug, deep), short fits."""
  config = configs.contextual.get_config("quick")
  config.problems = "toy_1d,toy_2d"
  config.toy_1d.variants = "csd"
  config.toy_2d.variants = "csd_aug,deep"
  config.toy_2d.steps.update({"matched": 200, "deep": 100})
  return _run_once(contextual, config, tmp_path_factory)


def test_contextual_matched_csd_ranks_like_its_closed_form(contextual_result):
  r = contextual_result
  assert r["summary"]["toy_1d/csd"]["vs"] == "Θ_L"
  assert r["summary"]["toy_1d/csd"]["spearman"] > 0.9
  # early stopping acts as a ridge: at the best one the variances agree closely
  assert r["summary"]["toy_1d/csd"]["median_norm_abs_err_at_best_ridge"] < 0.05


def _variants(r):
  return [
      (n, v)
      for n in ("toy_1d", "toy_2d", "mnist")
      if n in r
      for v in contextual.ALL_VARIANTS
      if v in r[n]
  ]


def test_contextual_reports_every_variant_on_every_split(contextual_result):
  r = contextual_result
  assert _variants(r) == [("toy_1d", "csd"), ("toy_2d", "csd_aug"), ("toy_2d", "deep")]
  for n, v in _variants(r):
    for split in ("overall", "in_dist", "off_dist"):
      assert {"spearman", "median_norm_abs_err"} <= set(r[n][v][split]), (n, v, split)
  assert r["summary"]["toy_2d/deep"]["vs"] == "cos Θ_L"
  assert r["config"]["toy_2d"]["steps"]["deep"] == 100


@pytest.mark.slow  # the quick profile: adds MNIST, exact-NTK labels and free towers (~2x the above)
def test_contextual_quick_profile_runs_every_code_path(tmp_path_factory):
  r = _run_once(contextual, configs.contextual.get_config("quick"), tmp_path_factory)
  assert _variants(r) == [
      ("toy_1d", "csd"),
      ("toy_1d", "ntk_labels"),
      ("toy_2d", "csd_aug"),
      ("toy_2d", "free_towers_ood"),
      ("toy_2d", "deep"),
      ("mnist", "csd_ood"),
  ]
  assert r["summary"]["toy_1d/ntk_labels"]["vs"] == "Θ̂"
  assert set(r["mnist"]["closed_form_variance_over_prior"]["last_layer"]) == {
      "test",
      "rot90",
      "inverted",
      "uniform_noise",
      "permuted",
      "sklearn_digits",
  }
  assert r["summary"]["mnist/csd_ood"]["spearman"] > 0.8
