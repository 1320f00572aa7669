"""The context preconditioner of matched CSD: optax transform, its matrix and a safe jitter.

With matched towers g(x, c) = ϕ̂(c)ᵀKϕ̂(x) is linear in K, and plain gradient descent shrinks the
error along direction pairs at rate λ_X·λ_C (feature second moments of X and of the context
distribution C). ``context_preconditioner`` left-multiplies the gradient by (Σ_C + εI)⁻¹ so
that only λ_X remains: the early-stopped estimate stops depending on where contexts lie.
``fitting.fit`` sets the matrix from the context distribution before step 0.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

Array = jax.Array


class PreconditionerState(NamedTuple):
  """matrix: (d, d), left-multiplies the gradient of the linear context map."""

  matrix: Array


def context_preconditioner() -> optax.GradientTransformation:
  """Left-multiplies the gradient of the matched context map ψ(c) = Kᵀϕ̂(c) by a (d, d) matrix.

  With g(x, c) = ϕ̂(c)ᵀKϕ̂(x) (K: the flax kernel, rows = context features) the mean squared
  loss over X × C has gradient Σ_C (K − I) Σ_X (Σ: feature second moments), so plain
  gradient descent shrinks the error along direction pairs at rate λ_X·λ_C: the early-stopped
  estimate then depends on the context distribution, and contexts with large features (e.g.
  OOD context) are learnt first, lowering V exactly where it should stay high. The matrix
  (Σ_C + εI)⁻¹ removes the C side (rate λ_X only: the kernel-regression flow of X's kernel) and
  leaves the converged solution unchanged.
  ``init`` sets the identity; ``precondition`` sets the matrix (``fitting.fit`` does, from the context
  distribution, when ``CSD.precondition_jitter`` > 0).
  """

  def init(params):
    d = params["context"]["params"]["linear"]["kernel"].shape[0]
    return PreconditionerState(jnp.eye(d, dtype=jnp.float32))

  def update(updates, state, params=None):
    del params
    ctx = dict(updates["context"])
    prm = dict(ctx["params"])
    lin = dict(prm["linear"])
    lin["kernel"] = state.matrix @ lin["kernel"]
    prm["linear"], ctx["params"] = lin, prm
    return {**updates, "context": ctx}, state

  return optax.GradientTransformation(init, update)


def second_moment(f: Array) -> Array:
  f = f.astype(jnp.float32)
  return f.T @ f / f.shape[0]


def mixture_moment(phi_x: Array, phi_extra: Array | None, extra_fraction: float) -> Array:
  m = second_moment(phi_x)
  if phi_extra is None:
    return m
  return (1.0 - extra_fraction) * m + extra_fraction * second_moment(phi_extra)


# A context batch of B rows moves the context map by Σ_b P ϕ̂_b ϕ̂_bᵀ / B, so one row of leverage
# q = ϕ̂ᵀPϕ̂ ≫ B kicks its feature direction q/B times harder than the population does; fits with
# max q beyond a few B drift from the closed form or diverge (docs/results.md, preconditioner).
MAX_LEVERAGE_PER_BATCH = 2.0


def stable_jitter(
    second_moment: Array,
    rows,
    batch_size: int,
    floor: float,
    max_leverage: float = MAX_LEVERAGE_PER_BATCH,
) -> float:
  """The smallest ε = floor · 2^k (k ≥ 0) with max_c ϕ̂(c)ᵀ(Σ_C + ε tr(Σ_C) I)⁻¹ϕ̂(c) ≤
  ``max_leverage`` · ``batch_size`` over the context rows (float64, host).

  Args:
    second_moment: (d, d) Σ_C.
    rows: arrays (n_i, d) of every row contexts are drawn from (X, extra contexts).
    batch_size: contexts per step.
    floor: the smallest ε (``CSD.precondition_jitter``), > 0.
  """
  if not floor > 0:
    raise ValueError(f"floor must be positive, got {floor}")
  m = np.asarray(second_moment, np.float64)
  lam, vec = np.linalg.eigh(m)
  proj = np.concatenate([np.asarray(r, np.float64) @ vec for r in rows if r is not None]) ** 2
  eps, bound = float(floor), max_leverage * batch_size
  for _ in range(40):
    if np.max(proj @ (1.0 / (np.maximum(lam, 0.0) + eps * np.trace(m)))) <= bound:
      break
    eps *= 2.0
  return eps


def precondition(model: Any, state: Any, second_moment: Array, jitter: float | None = None) -> Any:
  """Sets ``context_preconditioner``'s matrix to (Σ_C + ε tr(Σ_C) I)⁻¹, ε = ``jitter`` or
  ``model.precondition_jitter`` (computed in float64 on the host)."""
  if model.precondition_jitter <= 0:
    raise ValueError("precondition needs CSD.precondition_jitter > 0")
  eps = model.precondition_jitter if jitter is None else float(jitter)
  m = np.asarray(second_moment, np.float64)
  p = np.linalg.inv(m + eps * np.trace(m) * np.eye(m.shape[0]))
  first, *rest = state.opt_state
  return state._replace(opt_state=(first._replace(matrix=jnp.asarray(p, jnp.float32)), *rest))
