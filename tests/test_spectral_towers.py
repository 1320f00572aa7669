"""Distance-preserving towers (``models.MLPSpec.spectral_norm`` / ``residual``, as SNGP and DDU
use): the bound holds on the trained towers, the residual blocks keep distances, and the
option travels from the benchmark's config to the model."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from csd_jax import csd, models
from uncertainty_kit import methods

PRIOR = models.MLPSpec(widths=(32,), parameterization="standard")
TOWER = models.MLPSpec(widths=(32, 32), parameterization="standard")


def _features(spec, variables, x):
  """ϕ(x) of a tower's SpecNet (the params and stats under its ``net`` entry): (B, 32)."""
  net = models.SpecNet(dataclasses.replace(spec, out_dim=16))
  sub = {k: v["net"] for k, v in variables.items()}
  return net.apply(sub, x, method=models.SpecNet.features)


def _max_ratio(f, a, b):
  """max over rows of ‖f(a) − f(b)‖ / ‖a − b‖."""
  num = jnp.linalg.norm(f(a) - f(b), axis=-1)
  return float(jnp.max(num / jnp.linalg.norm(a - b, axis=-1)))


def test_spectral_norm_bounds_the_trained_towers_lipschitz_constant():
  x = 1.0 + 0.5 * jax.random.normal(jax.random.PRNGKey(0), (256, 8))
  a = 2.0 * jax.random.normal(jax.random.PRNGKey(1), (512, 8))
  b = a + 0.3 * jax.random.normal(jax.random.PRNGKey(2), (512, 8))
  c, ratios = 1.0, {}
  for bound in (None, c):
    tower = dataclasses.replace(TOWER, spectral_norm=bound)
    model = csd.deep_form(PRIOR, tower, num_steps=60, embed_dim=16, lr=1e-2)
    state = csd.init(model, jax.random.PRNGKey(3), x)
    for i in range(60):  # csd.train_step: one Adam step, then one power-iteration step
      batch = x[jax.random.permutation(jax.random.PRNGKey(i), 256)[:64]]
      state, _ = csd.train_step(model, state, batch, batch)
    v = state.params["feature"]
    ratios[bound] = _max_ratio(lambda z: _features(tower, v, z), a, b)
    if bound is not None:
      # each step advanced the stored power iteration: σ tracks the kernel's top singular value
      for i in range(2):
        kernel = v["params"]["net"][f"dense_layers_{i}"]["layer_instance"]["kernel"]
        sigma = v["batch_stats"]["net"][f"dense_layers_{i}"]["layer_instance/kernel/sigma"]
        np.testing.assert_allclose(sigma, jnp.linalg.norm(kernel, 2), rtol=2e-2)
  # two 1-Lipschitz ReLU layers of spectral norm c: ‖ϕ(a) − ϕ(b)‖ ≤ c² ‖a − b‖ (2 % for σ̂)
  assert ratios[c] <= 1.02 * c**2, ratios
  assert ratios[None] > c**2, ratios


def test_residual_blocks_with_spectral_norm_below_one_are_bi_lipschitz():
  c = 0.5
  spec = models.MLPSpec(
      widths=(8, 8), out_dim=4, parameterization="standard", spectral_norm=c, residual=True
  )
  net = models.SpecNet(spec)
  a = jax.random.normal(jax.random.PRNGKey(0), (512, 8))
  b = a + 0.1 * jax.random.normal(jax.random.PRNGKey(1), (512, 8))
  v = net.init(jax.random.PRNGKey(2), a[:1])

  @jax.jit
  def refresh(v):
    _, stats = net.apply(v, a[:1], update_stats=True, mutable=["batch_stats"])
    return {**v, **stats}

  for _ in range(30):  # the power iteration converges: σ̂ = σ
    v = refresh(v)
  f = lambda z: net.apply(v, z, method=models.SpecNet.features)
  ratio = jnp.linalg.norm(f(a) - f(b), axis=-1) / jnp.linalg.norm(a - b, axis=-1)
  # h ← h + relu(c W h / σ(W) + b) twice: (1 − c)² ≤ ratio ≤ (1 + c)²
  assert float(ratio.min()) >= (1 - c) ** 2 - 1e-4
  assert float(ratio.max()) <= (1 + c) ** 2 + 1e-4


def test_the_option_is_a_tower_config_field_and_has_no_kernel():
  config = methods.config_for("csd", {"tower": {"spectral_norm": 2.0, "residual": True}})
  methods.check_csd_config(config)
  model = methods.csd_model(config)
  assert (model.feature_net.spectral_norm, model.feature_net.residual) == (2.0, True)
  assert csd.spectral_norm_towers(model)
  assert not csd.spectral_norm_towers(methods.csd_model(methods.config_for("csd")))
  with pytest.raises(ValueError, match="no infinite-width kernel"):
    models.stax_layers(model.feature_net)
  with pytest.raises(ValueError, match="spectral_norm must be positive"):
    dataclasses.replace(TOWER, spectral_norm=0.0)
  with pytest.raises(ValueError, match="parameterization='standard'"):
    models.MLPSpec(widths=(4,), spectral_norm=1.0)  # NTK parameterisation
