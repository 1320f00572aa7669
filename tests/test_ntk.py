"""Kernels: empirical NTK = Jacobian product; spec-built flax net matches stax; last layer."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from csd_jax import models, ntk

SPECS = {
    "mlp_relu": models.MLPSpec(widths=(64, 64)),
    "mlp_erf": models.MLPSpec(widths=(32,), activation="erf", b_std=None),
    "cnn": models.CNNSpec(convs=((4, 3, 1), (4, 3, 2)), widths=(16,), out_dim=1),
    "mlp_standard": models.MLPSpec(widths=(32,), parameterization="standard"),
}


def _inputs(spec, n, seed):
  shape = (n, 6, 6, 2) if isinstance(spec, models.CNNSpec) else (n, 3)
  return jax.random.normal(jax.random.PRNGKey(seed), shape)


@functools.lru_cache(maxsize=None)
def _jacobian_reference(name):
  """(net, params, x1, x2, J(x1) J(x2)ᵀ) per spec, shared by both implementations' tests.

  ``ntk.jacobian_ntk`` runs under ``jax.jit``: eagerly, the CNN's jacrev took ~15 s per call.
  """
  spec = SPECS[name]
  net = models.module(spec)
  x1, x2 = _inputs(spec, 5, 0), _inputs(spec, 3, 1)
  params = net.init(jax.random.PRNGKey(2), x1)
  ref = jax.jit(functools.partial(ntk.jacobian_ntk, net.apply))(params, x1, x2)
  return net, params, x1, x2, ref


@pytest.mark.parametrize("name", sorted(SPECS))
@pytest.mark.parametrize("impl", ntk.IMPLEMENTATIONS)
def test_empirical_ntk_equals_jacobian_product(x64, name, impl):
  net, params, x1, x2, ref = _jacobian_reference(name)
  assert ref.dtype == jnp.float64
  k = ntk.empirical_ntk(net.apply, params, x1, x2, implementation=impl)
  assert k.shape == (5, 3)
  np.testing.assert_allclose(k, ref, rtol=1e-10, atol=1e-12)


def test_structured_derivatives_is_refused():
  with pytest.raises(ValueError, match="structured_derivatives"):
    ntk.empirical_ntk(lambda p, x: x, {}, jnp.ones((2, 1)), implementation="structured_derivatives")


@pytest.mark.parametrize("name", ["mlp_relu", "cnn"])
def test_flax_net_and_stax_share_the_function_distribution(x64, name):
  """Output variance over random inits of the flax net ≈ the stax NNGP kernel."""
  spec = SPECS[name]
  net = models.module(spec)
  x = _inputs(spec, 3, 0)
  keys = jax.random.split(jax.random.PRNGKey(0), 1000)
  outs = jax.jit(jax.vmap(lambda k: net.apply(net.init(k, x), x)[:, 0]))(keys)  # (1000, 3)
  emp = outs.T @ outs / outs.shape[0]
  nngp = ntk.infinite_kernels(spec, x, None, "nngp")
  np.testing.assert_allclose(emp, nngp, atol=0.12 * float(jnp.max(nngp)))


def test_wide_empirical_ntk_approaches_infinite(x64):
  spec = models.MLPSpec(widths=(2048, 2048))
  net = models.module(spec)
  x = _inputs(spec, 4, 0)
  params = net.init(jax.random.PRNGKey(1), x)
  emp = ntk.empirical_ntk(net.apply, params, x)
  inf = ntk.infinite_kernels(spec, x, None, "ntk")
  assert float(jnp.linalg.norm(emp - inf) / jnp.linalg.norm(inf)) < 0.1


def test_last_layer_ntk_is_the_ntk_of_the_head(x64):
  spec = SPECS["mlp_relu"]
  net = models.module(spec)
  x1, x2 = _inputs(spec, 4, 0), _inputs(spec, 3, 1)
  params = net.init(jax.random.PRNGKey(2), x1)

  def head_apply(head, x):
    return net.apply({"params": {**params["params"], "head": head}}, x)

  ref = ntk.jacobian_ntk(head_apply, params["params"]["head"], x1, x2)
  np.testing.assert_allclose(ntk.last_layer_ntk(spec, params, x1, x2), ref, rtol=1e-12)


def test_kernels_jit():
  spec = SPECS["mlp_relu"]
  net = models.module(spec)
  x = _inputs(spec, 4, 0)
  params = net.init(jax.random.PRNGKey(2), x)
  jitted = jax.jit(functools.partial(ntk.last_layer_ntk, spec))
  np.testing.assert_allclose(jitted(params, x), ntk.last_layer_ntk(spec, params, x), rtol=1e-5)
  inf = jax.jit(lambda a: ntk.infinite_kernels(spec, a, None, "ntk"))(x)
  assert inf.shape == (4, 4)
  emp = jax.jit(lambda p, a: ntk.empirical_ntk(net.apply, p, a))(params, x)
  assert emp.shape == (4, 4)


@pytest.mark.parametrize(
    "bad, match",
    [
        (jnp.ones((3,)), "rank"),
        (jnp.ones((3, 2), jnp.int32), "floating"),
        (jnp.full((3, 2), jnp.nan), "NaN"),
        (jnp.ones((0, 2)), "empty"),
    ],
)
def test_bad_inputs_name_the_argument(bad, match):
  spec = SPECS["mlp_relu"]
  with pytest.raises(ValueError, match=f"x1.*{match}|{match}.*x1|x1"):
    ntk.infinite_kernels(spec, bad)


def test_spec_validation():
  with pytest.raises(ValueError, match="activation"):
    models.MLPSpec(activation="tanh")
  with pytest.raises(ValueError, match="parameterization"):
    models.MLPSpec(parameterization="mup")
  with pytest.raises(ValueError, match="widths"):
    models.MLPSpec(widths=())


@pytest.mark.parametrize("param,b_std", [("ntk", 0.1), ("standard", 0.1), ("ntk", None)])
def test_one_hot_product_equals_the_materialised_pairs(param, b_std):
  """An MLP on a OneHotProduct (first layer factored) gives the outputs and features of the same
  params on the materialised (B * A, D + A) pairs, rows b * A + a = [x_b, e_a]."""
  x = jax.random.normal(jax.random.PRNGKey(0), (5, 7))
  product = models.OneHotProduct(x, 3)
  pairs = models.as_array(product)
  assert product.shape == pairs.shape == (15, 10)
  np.testing.assert_array_equal(pairs[3 * 2 + 1], jnp.concatenate([x[2], jnp.eye(3)[1]]))
  net = models.module(
      models.MLPSpec(widths=(16, 8), out_dim=4, parameterization=param, b_std=b_std)
  )
  params = net.init(jax.random.PRNGKey(1), pairs[:1])
  np.testing.assert_allclose(
      net.apply(params, product), net.apply(params, pairs), rtol=1e-5, atol=1e-6
  )
  np.testing.assert_allclose(
      net.apply(params, product, method=models.SpecNet.features),
      net.apply(params, pairs, method=models.SpecNet.features),
      rtol=1e-5,
      atol=1e-6,
  )


def _one_hot_rows(key, batch, blocks):
  """(batch, sum(blocks)) rows of one-hot blocks, the first row's blocks all zero."""
  cols = []
  for k, size in zip(jax.random.split(key, len(blocks)), blocks):
    hot = jax.nn.one_hot(jax.random.randint(k, (batch,), 0, size), size)
    cols.append(hot.at[0].set(0.0))
  return jnp.concatenate(cols, axis=-1)


@pytest.mark.parametrize("param,b_std", [("ntk", 0.1), ("standard", None)])
def test_one_hot_blocks_give_the_dense_nets_outputs_and_gradients(param, b_std):
  """A first layer that gathers the hot rows (``one_hot_blocks``) computes the dense net's
  function with the same params: outputs bitwise equal, gradients equal to float rounding, on
  one-hot and all-zero blocks, as plain inputs and inside a OneHotProduct."""
  blocks = (9, 4)
  dense_spec = models.MLPSpec(widths=(16, 8), out_dim=3, parameterization=param, b_std=b_std)
  gather_spec = models.MLPSpec(
      widths=(16, 8), out_dim=3, parameterization=param, b_std=b_std, one_hot_blocks=blocks
  )
  dense, gather = models.module(dense_spec), models.module(gather_spec)
  x = _one_hot_rows(jax.random.PRNGKey(0), 6, blocks)
  params = dense.init(jax.random.PRNGKey(1), x[:1])
  assert jax.tree.structure(gather.init(jax.random.PRNGKey(1), x[:1])) == jax.tree.structure(params)
  np.testing.assert_array_equal(gather.apply(params, x), dense.apply(params, x))
  loss = lambda net: jax.grad(lambda p: jnp.sum(jnp.sin(net.apply(p, x))))(params)
  for g, d in zip(jax.tree.leaves(loss(gather)), jax.tree.leaves(loss(dense))):
    np.testing.assert_allclose(g, d, rtol=1e-5, atol=1e-6)

  states = x[:, :9]
  product = models.OneHotProduct(states, 4)
  np.testing.assert_array_equal(gather.apply(params, product), dense.apply(params, product))
  np.testing.assert_allclose(
      gather.apply(params, product),
      dense.apply(params, models.as_array(product)),
      rtol=1e-5,
      atol=1e-6,
  )


def test_one_hot_blocks_must_fit_the_inputs():
  with pytest.raises(ValueError, match="one_hot_blocks"):
    models.MLPSpec(one_hot_blocks=(3, 0))
  assert models.MLPSpec(one_hot_blocks=[3, 2]).one_hot_blocks == (3, 2)  # hashable: a jit key
  net = models.module(models.MLPSpec(widths=(8,), one_hot_blocks=(3, 2)))
  with pytest.raises(ValueError, match="sum to 5, but the inputs have 6"):
    net.init(jax.random.PRNGKey(0), jnp.zeros((1, 6)))
  params = net.init(jax.random.PRNGKey(0), jnp.zeros((1, 5)))
  with pytest.raises(ValueError, match="last of one_hot_blocks"):
    net.apply(params, models.OneHotProduct(jnp.zeros((2, 2)), 3))


def test_one_hot_product_needs_an_mlp():
  net = models.module(models.CNNSpec(convs=((4, 3, 1),), widths=(8,), out_dim=1))
  params = net.init(jax.random.PRNGKey(0), jnp.zeros((1, 4, 4, 2)))
  with pytest.raises(ValueError, match="OneHotProduct"):
    net.apply(params, models.OneHotProduct(jnp.zeros((2, 32)), 2))
