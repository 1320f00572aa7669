"""Closed-form predictive variances of infinite ensembles of wide networks.

Two different ensembles, two different covariances (DESIGN.md §1):

* ``ntkgp_variance`` — the **NTK-GP** (He, Lakshminarayanan & Teh 2020): an ensemble
  whose initial functions have the NTK Θ as prior covariance (e.g. nets with the
  randomised additive prior of He et al.), trained to convergence by gradient descent
  on squared loss. Posterior variance

      V(x) = Θ(x,x) − Θ(x,X) Θ(X,X)⁻¹ Θ(X,x).                         (NTK-GP)

  This is what CSD estimates; neural-tangents calls it ``get='ntkgp'``.
* ``standard_ensemble_variance`` — the **standard-initialisation** ensemble of
  Lee et al. 2019: plain nets trained by gradient descent, whose initial functions
  have the NNGP kernel K as covariance. Its variance also needs K:

      V(x) = K(x,x) + Θ(x,X)Θ⁻¹K(X,X)Θ⁻¹Θ(X,x) − 2 Θ(x,X)Θ⁻¹K(X,x).   (Lee et al. eq. 16)

  neural-tangents calls it ``get='ntk'`` (also ``gradient_descent_mse_ensemble`` at t=∞).

Regularisation follows neural-tangents: ``diag_reg`` is added to the diagonal of the
training Gram matrix, multiplied by its mean diagonal unless ``diag_reg_absolute_scale``.

Both factor the Gram matrix once (Cholesky) and then treat queries in chunks, so the
function forms (``*_fn``) use O(N² + N·chunk) memory for any number of queries.
A Gram matrix that is not positive definite at the requested ``diag_reg`` raises
``NotPositiveDefiniteError`` (eagerly; under an outer ``jax.jit`` the check cannot raise
and the result is NaN — call eagerly or with ``check=False`` knowingly).
"""

from __future__ import annotations

from typing import Callable

import chex
import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl

from csd_jax.validate import check_array, is_concrete

Array = jax.Array
KernelFn = Callable[[Array, Array], Array]


class NotPositiveDefiniteError(ValueError):
  """The training Gram matrix has no Cholesky factor at the requested regularisation."""


@chex.dataclass(frozen=True)
class Factor:
  """Cholesky factor of the regularised Gram matrix: ``L Lᵀ = K + reg · I``."""
  lower: Array        # (N, N)
  diag_reg: Array     # () the absolute regularisation added
  ok: Array           # () bool, False if the factorisation failed


@jax.jit
def _factor(k_train_train: Array, diag_reg: float, absolute: bool) -> Factor:
  n = k_train_train.shape[0]
  scale = jnp.where(absolute, 1.0, jnp.trace(k_train_train) / n)
  reg = diag_reg * scale
  lower = jnp.linalg.cholesky(k_train_train + reg * jnp.eye(n, dtype=k_train_train.dtype))
  return Factor(lower=lower, diag_reg=jnp.asarray(reg), ok=jnp.all(jnp.isfinite(lower)))


def factor(k_train_train: Array, diag_reg: float = 0.0, *,
           diag_reg_absolute_scale: bool = False, check: bool = True) -> Factor:
  """Cholesky-factors ``Θ(X,X) + reg·I``; raises NotPositiveDefiniteError if impossible.

  Args:
    k_train_train: (N, N) symmetric kernel matrix of the training inputs.
    diag_reg: regularisation; relative to the mean diagonal unless
      ``diag_reg_absolute_scale``.
    check: raise on failure (concrete inputs only).
  """
  check_array("k_train_train", k_train_train, rank=2)
  if k_train_train.shape[0] != k_train_train.shape[1]:
    raise ValueError(f"k_train_train must be square, got shape {k_train_train.shape}")
  if diag_reg < 0:
    raise ValueError(f"diag_reg must be >= 0, got {diag_reg}")
  f = _factor(k_train_train, diag_reg, diag_reg_absolute_scale)
  if check and is_concrete(f.ok) and not bool(f.ok):
    raise NotPositiveDefiniteError(
        f"the training Gram matrix ({k_train_train.shape[0]}×{k_train_train.shape[0]}) is "
        f"not positive definite at diag_reg={diag_reg} "
        f"({'absolute' if diag_reg_absolute_scale else 'relative to the mean diagonal'}); "
        "increase diag_reg or remove duplicate training points")
  return f


def _solve(f: Factor, b: Array) -> Array:
  """(K + reg)⁻¹ b for b (N, M)."""
  return jsl.cho_solve((f.lower, True), b)


@jax.jit
def _ntkgp_from_factor(f: Factor, k_test_train: Array, k_test_test_diag: Array) -> Array:
  a = jsl.solve_triangular(f.lower, k_test_train.T, lower=True)  # L⁻¹ Θ(X, x): (N, M)
  return k_test_test_diag - jnp.sum(a * a, axis=0)


@jax.jit
def _standard_from_factor(f: Factor, ntk_test_train: Array, nngp_train_train: Array,
                          nngp_test_train: Array, nngp_test_test_diag: Array) -> Array:
  b = _solve(f, ntk_test_train.T)  # Θ⁻¹ Θ(X, x): (N, M)
  quad = jnp.sum(b * (nngp_train_train @ b), axis=0)
  cross = jnp.sum(b * nngp_test_train.T, axis=0)
  return nngp_test_test_diag + quad - 2.0 * cross


def _check_test(k_test_train: Array, k_test_test_diag: Array, n: int, prefix: str) -> None:
  check_array(f"{prefix}_test_train", k_test_train, rank=2)
  check_array(f"{prefix}_test_test_diag", k_test_test_diag, rank=1)
  if k_test_train.shape[1] != n:
    raise ValueError(
        f"{prefix}_test_train must have {n} columns (one per training point), "
        f"got shape {k_test_train.shape}")
  if k_test_test_diag.shape[0] != k_test_train.shape[0]:
    raise ValueError(
        f"{prefix}_test_test_diag must have {k_test_train.shape[0]} entries, "
        f"got {k_test_test_diag.shape[0]}")


def ntkgp_variance(k_train_train: Array, k_test_train: Array, k_test_test_diag: Array,
                   diag_reg: float = 0.0, *, diag_reg_absolute_scale: bool = False,
                   check: bool = True) -> Array:
  """NTK-GP posterior variance V(x) = Θ(x,x) − Θ(x,X)Θ(X,X)⁻¹Θ(X,x) (module docstring).

  Args:
    k_train_train: Θ(X, X), (N, N).
    k_test_train: Θ(x, X), (M, N).
    k_test_test_diag: Θ(x, x), (M,).
    diag_reg: see module docstring.

  Returns:
    (M,) variances, clipped at 0 (negatives can only come from round-off).
  """
  f = factor(k_train_train, diag_reg, diag_reg_absolute_scale=diag_reg_absolute_scale,
             check=check)
  _check_test(k_test_train, k_test_test_diag, k_train_train.shape[0], "k")
  return jnp.maximum(_ntkgp_from_factor(f, k_test_train, k_test_test_diag), 0.0)


def standard_ensemble_variance(ntk_train_train: Array, ntk_test_train: Array,
                               nngp_train_train: Array, nngp_test_train: Array,
                               nngp_test_test_diag: Array, diag_reg: float = 0.0, *,
                               diag_reg_absolute_scale: bool = False,
                               check: bool = True) -> Array:
  """Variance of the standard-initialisation infinite ensemble (Lee et al. 2019).

  neural-tangents' ``gp_inference(...)(get='ntk')``; NOT the NTK-GP that CSD targets.
  ``diag_reg`` regularises Θ(X,X) only, as in neural-tangents. Shapes as in
  ``ntkgp_variance``, for the NTK Θ (``ntk_*``) and the NNGP kernel K (``nngp_*``).
  """
  f = factor(ntk_train_train, diag_reg, diag_reg_absolute_scale=diag_reg_absolute_scale,
             check=check)
  n = ntk_train_train.shape[0]
  _check_test(ntk_test_train, nngp_test_test_diag, n, "ntk")
  _check_test(nngp_test_train, nngp_test_test_diag, n, "nngp")
  chex.assert_shape(nngp_train_train, (n, n))
  var = _standard_from_factor(f, ntk_test_train, nngp_train_train, nngp_test_train,
                              nngp_test_test_diag)
  return jnp.maximum(var, 0.0)


def _chunks(x: Array, chunk_size: int) -> tuple[Array, int]:
  """Pads x to a multiple of chunk_size and reshapes to (num_chunks, chunk, ...)."""
  m = x.shape[0]
  pad = (-m) % chunk_size
  x = jnp.concatenate([x, jnp.repeat(x[-1:], pad, axis=0)]) if pad else x
  return x.reshape((-1, chunk_size) + x.shape[1:]), m


def ntkgp_variance_fn(kernel_fn: KernelFn, x_train: Array, x_query: Array,
                      diag_reg: float = 0.0, *, chunk_size: int = 512,
                      diag_reg_absolute_scale: bool = False) -> Array:
  """NTK-GP variance at many queries in O(N² + N·chunk) memory.

  Args:
    kernel_fn: ``kernel_fn(x1, x2) -> (N1, N2)``, jit-able (e.g. a stax kernel_fn with
      ``get='ntk'`` bound, or ``functools.partial(ntk.empirical_ntk, apply, params)``).
    x_train: (N, ...) training inputs. x_query: (M, ...) queries.
    chunk_size: queries per chunk.

  Returns:
    (M,) variances.
  """
  check_array("x_train", x_train, min_rank=2)
  check_array("x_query", x_query, min_rank=2)
  if chunk_size < 1:
    raise ValueError(f"chunk_size must be positive, got {chunk_size}")
  f = factor(kernel_fn(x_train, x_train), diag_reg,
             diag_reg_absolute_scale=diag_reg_absolute_scale)
  chunks, m = _chunks(x_query, min(chunk_size, x_query.shape[0]))

  def one(xq):
    k_qx = kernel_fn(xq, x_train)
    k_qq = jax.vmap(lambda x: kernel_fn(x[None], x[None])[0, 0])(xq)
    return _ntkgp_from_factor(f, k_qx, k_qq)

  return jnp.maximum(jax.lax.map(one, chunks).reshape(-1)[:m], 0.0)
