"""Single-query CSD: the exact-fit theorem for one query x_t (docs/design.md, §1).

Train the centred net g = h(·, θ) − h(·, θ₀) by full-batch gradient descent on labels
Θ̂(X, x_t); at convergence V(x_t) = Θ̂(x_t, x_t) − g(x_t), exactly for a model linear in its
parameters and up to O(1/√width) for a wide net in NTK parameterisation.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import chex
import jax
import jax.numpy as jnp

Array = jax.Array
PyTree = Any


def _scalar_outputs(apply_fn: Callable[[PyTree, Array], Array], params: PyTree, x: Array) -> Array:
  out = apply_fn(params, x)
  if out.size != x.shape[0]:
    raise ValueError(
        f"apply_fn must have one output per example ((B,) or (B, 1)), got shape "
        f"{out.shape} for {x.shape[0]} inputs"
    )
  return out.reshape(x.shape[0])


def single_query_predict(
    apply_fn: Callable[[PyTree, Array], Array], params: PyTree, params0: PyTree, x: Array
) -> Array:
  """The centred net g(x) = h(x, θ) − h(x, θ₀): (M,).

  Centring makes g start at exactly 0 without changing its NTK (the subtracted term does not
  depend on θ), the small-output init the single-query theorem needs.

  Args:
    apply_fn: ``apply_fn(params, x) -> (B,)`` or ``(B, 1)``: a scalar-output net h.
    params: θ (e.g. from ``fit_single_query``). params0: θ₀, the init g is centred at.
    x: (M, ...) inputs.
  """
  return _scalar_outputs(apply_fn, params, x) - _scalar_outputs(apply_fn, params0, x)


def _gram_lambda_max(apply_fn, params0: PyTree, x: Array, num_iters: int = 64) -> Array:
  """Largest eigenvalue of Θ̂(X, X) = J Jᵀ at θ₀ by power iteration with jvp/vjp (no Jacobian
  in memory). Returns the Rayleigh quotient, which is ≤ λ_max."""
  h = lambda p: _scalar_outputs(apply_fn, p, x)
  _, vjp = jax.vjp(h, params0)

  def gram_times(v):
    (u,) = vjp(v)
    return jax.jvp(h, (params0,), (u,))[1]

  n = x.shape[0]
  v0 = jnp.ones((n,), jax.eval_shape(h, params0).dtype) / jnp.sqrt(n)

  def body(_, v):
    w = gram_times(v)
    return w / jnp.linalg.norm(w)

  v = jax.lax.fori_loop(0, num_iters, body, v0)
  return jnp.vdot(v, gram_times(v))


@functools.partial(jax.jit, static_argnames=("apply_fn", "num_steps"))
def fit_single_query(
    apply_fn: Callable[[PyTree, Array], Array],
    params0: PyTree,
    x_train: Array,
    labels: Array,
    *,
    num_steps: int,
    learning_rate: float | Array | None = None,
) -> PyTree:
  """Trains the centred net g = h(·, θ) − h(·, θ₀) by full-batch gradient descent on labels.

  The single-query theorem (docs/design.md §1): with labels ``Θ̂(X, x_t)``, gradient descent to
  convergence gives ``g(x) → Θ̂(x,X) Θ̂(X,X)⁻¹ Θ̂(X,x_t)`` — exactly for a model linear in its
  parameters, up to O(1/sqrt(width)) for a wide net in NTK parameterisation — so
  ``V(x_t) = Θ̂(x_t, x_t) − g(x_t)``. Loss ½ Σᵢ (g(xᵢ) − yᵢ)² (a sum, so that in function
  space ġ = −η Θ̂ (g − y) and η < 2/λ_max(Θ̂) is stable).

  θ₀ is a traced argument, not a closure constant: capturing wide params as constants makes
  XLA constant-fold for minutes (docs/design.md §3). ``jax.vmap`` over ``labels`` trains several
  queries at once (one parameter copy each).

  Args:
    apply_fn: ``apply_fn(params, x) -> (B,)`` or ``(B, 1)`` (static: keep the same object
      between calls to reuse the compilation).
    params0: θ₀, the init and the centre of g.
    x_train: (N, ...) training inputs X.
    labels: (N,) regression targets, e.g. Θ̂(X, x_t).
    num_steps: gradient steps (static).
    learning_rate: step size η; None picks 1/λ_max(Θ̂(X, X)) at θ₀ (power iteration).

  Returns:
    θ after ``num_steps`` steps; predict with ``single_query_predict(apply_fn, θ, θ₀, x)``.
  """
  chex.assert_rank(labels, 1)
  chex.assert_axis_dimension(labels, 0, x_train.shape[0])
  if learning_rate is None:
    learning_rate = 1.0 / _gram_lambda_max(apply_fn, params0, x_train)

  def loss_fn(p):
    r = single_query_predict(apply_fn, p, params0, x_train) - labels
    return 0.5 * jnp.sum(r * r)

  grad_fn = jax.grad(loss_fn)

  def step(_, p):
    g = grad_fn(p)
    return jax.tree_util.tree_map(lambda a, b: a - learning_rate * b, p, g)

  return jax.lax.fori_loop(0, num_steps, step, params0)
