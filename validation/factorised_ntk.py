"""A factorised empirical NTK of MLPs: the exact kernel of ``ntk.empirical_ntk`` without a
Jacobian in memory (the contextual closed forms on MNIST need it)."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def mlp_empirical_ntk(spec, params, x1, x2=None):
  """Θ̂(x1, x2) of an ``MLPSpec`` net in NTK parameterisation, factorised layer by layer.

  For a layer y = σ_w/sqrt(fan_in) a W + σ_b b, the parameter gradients are outer products of
  the layer's input a and the backpropagated vector δ = ∂f/∂y, so

      Θ̂(x, x') = 1/out Σ_k Σ_l (σ_w²/fan_in a_{l−1}(x)·a_{l−1}(x') + σ_b²) δ_{l,k}(x)·δ_{l,k}(x'),

  which costs O(N1 N2 width) per layer instead of O(N1 N2 #params) and never holds a Jacobian
  (the MNIST closed forms need it). Same value as ``ntk.empirical_ntk`` (``ntk_check`` checks
  it).

  Args:
    spec: an ``MLPSpec`` with ``parameterization="ntk"``.
    params: the net's flax params. x1: (N1, d). x2: (N2, d) or None (= x1).

  Returns:
    (N1, N2) kernel.
  """
  if spec.parameterization != "ntk" or hasattr(spec, "convs"):
    raise ValueError("mlp_empirical_ntk supports MLPSpec in NTK parameterisation only")
  p = params["params"]
  act = {"relu": jax.nn.relu, "erf": jax.scipy.special.erf}[spec.activation]
  act_grad = {
      "relu": lambda y: (y > 0).astype(y.dtype),
      "erf": lambda y: 2.0 / jnp.sqrt(jnp.pi) * jnp.exp(-y * y),
  }[spec.activation]
  sb2 = 0.0 if spec.b_std is None else spec.b_std**2
  names = [f"dense_layers_{i}" for i in range(len(spec.widths))] + ["head"]

  def layer_terms(x):
    """Inputs a_{l-1} (B, fan_in) and deltas δ_l (B, out, width) for every layer."""
    acts, pre = [x], []
    a = x
    for name in names[:-1]:
      w = p[name]["kernel"]
      y = spec.w_std / jnp.sqrt(a.shape[-1]) * a @ w
      if spec.b_std is not None:
        y = y + spec.b_std * p[name]["bias"]
      pre.append(y)
      a = act(y)
      acts.append(a)
    out = spec.out_dim
    delta = jnp.broadcast_to(jnp.eye(out, dtype=x.dtype), (x.shape[0], out, out))
    deltas = [delta]
    for i in range(len(names) - 1, 0, -1):  # from the head down to the first layer
      w = p[names[i]]["kernel"]  # (fan_in, width_i)
      scale = spec.w_std / jnp.sqrt(w.shape[0])
      delta = scale * jnp.einsum("bkj,ij->bki", delta, w) * act_grad(pre[i - 1])[:, None, :]
      deltas.append(delta)
    return acts, deltas[::-1]

  @jax.jit
  def kernel(x1, x2):
    a1, d1 = layer_terms(x1)
    a2, d2 = layer_terms(x2)
    total = 0.0
    for l in range(len(names)):
      fan_in = a1[l].shape[-1]
      inputs = spec.w_std**2 / fan_in * (a1[l] @ a2[l].T) + sb2
      total = total + inputs * jnp.einsum("bkj,ckj->bc", d1[l], d2[l])
    return total / spec.out_dim

  x1 = jnp.asarray(x1)
  return kernel(x1, x1 if x2 is None else jnp.asarray(x2))
