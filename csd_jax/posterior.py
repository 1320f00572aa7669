"""Closed-form predictive variances of infinite ensembles of wide networks.

Two different ensembles, two different covariances (docs/design.md §1):

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

Ill-conditioned Gram matrices: when the Cholesky factor at the requested ``diag_reg`` fails
(round-off makes a singular or nearly singular Θ(X,X) numerically indefinite), the jitter is
escalated inside the compiled factorisation — ``max(10·diag_reg, eps)``, then ×10 each try —
up to ``max_diag_reg`` (same units as ``diag_reg``; 0 disables escalation). Eagerly, a raised
jitter gives a ``JitterWarning`` naming the value used, and a matrix that no jitter up to the
limit makes positive definite raises ``NotPositiveDefiniteError``; neither NaN nor a negative
variance is returned. Under an outer ``jax.jit`` the escalation still runs but nothing can
raise: the failed factor is NaN (``Factor.ok`` is False) — call eagerly, or check ``ok``.
"""

from __future__ import annotations

import functools
import warnings
from typing import Callable

import chex
import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl

from csd_jax.checks import check_array, is_concrete

Array = jax.Array
KernelFn = Callable[[Array, Array], Array]


DEFAULT_MAX_DIAG_REG = 1e-4
"""Default limit of the jitter escalation (module docstring), in ``diag_reg``'s units."""


class NotPositiveDefiniteError(ValueError):
  """The training Gram matrix has no Cholesky factor at any jitter up to the limit."""


class JitterWarning(UserWarning):
  """The Cholesky factor needed more jitter than the requested ``diag_reg``."""


@chex.dataclass(frozen=True)
class Factor:
  """Cholesky factor of the regularised Gram matrix: ``L Lᵀ = K + reg · I``."""

  lower: Array  # (N, N)
  diag_reg: Array  # () the absolute regularisation added (reg)
  jitter: Array  # () the same in the caller's units (relative unless absolute)
  ok: Array  # () bool, False if even the largest jitter failed


@functools.partial(jax.jit, static_argnames=("absolute",))
def _factor(k_train_train: Array, diag_reg: float, max_diag_reg: float, absolute: bool) -> Factor:
  n = k_train_train.shape[0]
  dtype = k_train_train.dtype
  scale = 1.0 if absolute else jnp.trace(k_train_train) / n
  eye = jnp.eye(n, dtype=dtype)
  smallest = jnp.asarray(jnp.finfo(dtype).eps, dtype)

  def chol(jitter):
    lower = jnp.linalg.cholesky(k_train_train + (jitter * scale) * eye)
    return lower, jnp.all(jnp.isfinite(lower))

  def next_jitter(jitter):
    return jnp.maximum(10.0 * jitter, smallest)

  def failed_with_room(carry):
    _, ok, jitter = carry
    return ~ok & (next_jitter(jitter) <= max_diag_reg)

  def retry(carry):
    jitter = next_jitter(carry[2])
    return (*chol(jitter), jitter)

  jitter0 = jnp.asarray(diag_reg, dtype)
  lower, ok, jitter = jax.lax.while_loop(failed_with_room, retry, (*chol(jitter0), jitter0))
  return Factor(lower=lower, diag_reg=jitter * scale, jitter=jitter, ok=ok)


def factor(
    k_train_train: Array,
    diag_reg: float = 0.0,
    *,
    diag_reg_absolute_scale: bool = False,
    max_diag_reg: float = DEFAULT_MAX_DIAG_REG,
    check: bool = True,
) -> Factor:
  """Cholesky-factors ``Θ(X,X) + reg·I``, escalating the jitter where needed.

  Args:
    k_train_train: (N, N) symmetric kernel matrix of the training inputs.
    diag_reg: regularisation; relative to the mean diagonal unless
      ``diag_reg_absolute_scale``.
    max_diag_reg: the largest jitter the escalation may reach (module docstring), in the
      units of ``diag_reg``; ``0`` (or anything <= diag_reg) disables escalation.
    check: warn on an escalated jitter and raise ``NotPositiveDefiniteError`` on failure
      (concrete inputs only).
  """
  check_array("k_train_train", k_train_train, rank=2)
  if k_train_train.shape[0] != k_train_train.shape[1]:
    raise ValueError(f"k_train_train must be square, got shape {k_train_train.shape}")
  if diag_reg < 0:
    raise ValueError(f"diag_reg must be >= 0, got {diag_reg}")
  if max_diag_reg < 0:
    raise ValueError(f"max_diag_reg must be >= 0, got {max_diag_reg}")
  f = _factor(k_train_train, diag_reg, max_diag_reg, diag_reg_absolute_scale)
  if not (check and is_concrete(f.ok)):
    return f
  n = k_train_train.shape[0]
  units = "absolute" if diag_reg_absolute_scale else "relative to the mean diagonal"
  if not bool(f.ok):
    raise NotPositiveDefiniteError(
        f"the training Gram matrix ({n}×{n}) is not positive definite at diag_reg={diag_reg} "
        f"nor at any jitter up to max_diag_reg={max_diag_reg} ({units}); it is indefinite "
        "beyond round-off: check the kernel, or raise diag_reg / max_diag_reg"
    )
  if float(f.jitter) > diag_reg:
    warnings.warn(
        f"the training Gram matrix ({n}×{n}) is not numerically positive definite at "
        f"diag_reg={diag_reg}; used jitter {float(f.jitter):.1e} ({units}) instead "
        "(duplicate or nearly collinear training points?)",
        JitterWarning,
        stacklevel=2,
    )
  return f


def _solve(f: Factor, b: Array) -> Array:
  """(K + reg)⁻¹ b for b (N, M)."""
  return jsl.cho_solve((f.lower, True), b)


@jax.jit
def _ntkgp_from_factor(f: Factor, k_test_train: Array, k_test_test_diag: Array) -> Array:
  a = jsl.solve_triangular(f.lower, k_test_train.T, lower=True)  # L⁻¹ Θ(X, x): (N, M)
  return k_test_test_diag - jnp.sum(a * a, axis=0)


@jax.jit
def _standard_from_factor(
    f: Factor,
    ntk_test_train: Array,
    nngp_train_train: Array,
    nngp_test_train: Array,
    nngp_test_test_diag: Array,
) -> Array:
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
        f"got shape {k_test_train.shape}"
    )
  if k_test_test_diag.shape[0] != k_test_train.shape[0]:
    raise ValueError(
        f"{prefix}_test_test_diag must have {k_test_train.shape[0]} entries, "
        f"got {k_test_test_diag.shape[0]}"
    )


def ntkgp_variance(
    k_train_train: Array,
    k_test_train: Array,
    k_test_test_diag: Array,
    diag_reg: float = 0.0,
    *,
    diag_reg_absolute_scale: bool = False,
    max_diag_reg: float = DEFAULT_MAX_DIAG_REG,
    check: bool = True,
) -> Array:
  """NTK-GP posterior variance V(x) = Θ(x,x) − Θ(x,X)Θ(X,X)⁻¹Θ(X,x) (module docstring).

  Args:
    k_train_train: Θ(X, X), (N, N).
    k_test_train: Θ(x, X), (M, N).
    k_test_test_diag: Θ(x, x), (M,).
    diag_reg, max_diag_reg: regularisation and jitter limit (``factor``).

  Returns:
    (M,) variances, clipped at 0 (negatives can only come from round-off).
  """
  f = factor(
      k_train_train,
      diag_reg,
      diag_reg_absolute_scale=diag_reg_absolute_scale,
      max_diag_reg=max_diag_reg,
      check=check,
  )
  _check_test(k_test_train, k_test_test_diag, k_train_train.shape[0], "k")
  return jnp.maximum(_ntkgp_from_factor(f, k_test_train, k_test_test_diag), 0.0)


def standard_ensemble_variance(
    ntk_train_train: Array,
    ntk_test_train: Array,
    nngp_train_train: Array,
    nngp_test_train: Array,
    nngp_test_test_diag: Array,
    diag_reg: float = 0.0,
    *,
    diag_reg_absolute_scale: bool = False,
    max_diag_reg: float = DEFAULT_MAX_DIAG_REG,
    check: bool = True,
) -> Array:
  """Variance of the standard-initialisation infinite ensemble (Lee et al. 2019).

  neural-tangents' ``gp_inference(...)(get='ntk')``; NOT the NTK-GP that CSD targets.
  ``diag_reg`` regularises Θ(X,X) only, as in neural-tangents. Shapes as in
  ``ntkgp_variance``, for the NTK Θ (``ntk_*``) and the NNGP kernel K (``nngp_*``).
  """
  f = factor(
      ntk_train_train,
      diag_reg,
      diag_reg_absolute_scale=diag_reg_absolute_scale,
      max_diag_reg=max_diag_reg,
      check=check,
  )
  n = ntk_train_train.shape[0]
  _check_test(ntk_test_train, nngp_test_test_diag, n, "ntk")
  _check_test(nngp_test_train, nngp_test_test_diag, n, "nngp")
  chex.assert_shape(nngp_train_train, (n, n))
  var = _standard_from_factor(
      f, ntk_test_train, nngp_train_train, nngp_test_train, nngp_test_test_diag
  )
  return jnp.maximum(var, 0.0)


def _chunks(x: Array, chunk_size: int) -> tuple[Array, int]:
  """Pads x to a multiple of chunk_size and reshapes to (num_chunks, chunk, ...)."""
  m = x.shape[0]
  pad = (-m) % chunk_size
  x = jnp.concatenate([x, jnp.repeat(x[-1:], pad, axis=0)]) if pad else x
  return x.reshape((-1, chunk_size) + x.shape[1:]), m


def ntkgp_variance_fn(
    kernel_fn: KernelFn,
    x_train: Array,
    x_query: Array,
    diag_reg: float = 0.0,
    *,
    chunk_size: int = 512,
    diag_reg_absolute_scale: bool = False,
    max_diag_reg: float = DEFAULT_MAX_DIAG_REG,
) -> Array:
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
  f = factor(
      kernel_fn(x_train, x_train),
      diag_reg,
      diag_reg_absolute_scale=diag_reg_absolute_scale,
      max_diag_reg=max_diag_reg,
  )
  chunks, m = _chunks(x_query, min(chunk_size, x_query.shape[0]))

  def one(xq):
    k_qx = kernel_fn(xq, x_train)
    k_qq = jax.vmap(lambda x: kernel_fn(x[None], x[None])[0, 0])(xq)
    return _ntkgp_from_factor(f, k_qx, k_qq)

  return jnp.maximum(jax.lax.map(one, chunks).reshape(-1)[:m], 0.0)


def ntkgp_variance_from_features(
    phi_train: Array,
    phi_query: Array,
    diag_reg: float = 0.0,
    *,
    diag_reg_absolute_scale: bool = False,
) -> Array:
  """``ntkgp_variance`` for a kernel given by explicit features, Θ(x, c) = ϕ(x)·ϕ(c) (e.g. the
  last-layer NTK, ``models.last_layer_features``), through the d × d primal system:

      V(x) = σ² ϕ(x)ᵀ (ΦᵀΦ + σ² I)⁻¹ ϕ(x)                     (Woodbury on NTK-GP)

  with σ² the regularisation added to Θ(X, X)'s diagonal (``diag_reg`` × its mean diagonal
  tr(ΦᵀΦ)/N, as ``factor``, unless ``diag_reg_absolute_scale``). O(N d² + d³) time and
  O(d²) memory instead of O(N³) and O(N²); needs σ² > 0 when N ≥ d (ΦᵀΦ may be singular).

  Args:
    phi_train: Φ, (N, d) features of the training inputs.
    phi_query: (M, d) features of the queries.

  Returns:
    (M,) variances, in [0, ϕ(x)·ϕ(x)].
  """
  check_array("phi_train", phi_train, rank=2)
  check_array("phi_query", phi_query, rank=2)
  if phi_query.shape[1] != phi_train.shape[1]:
    raise ValueError(
        f"phi_query must have {phi_train.shape[1]} features, " f"got shape {phi_query.shape}"
    )
  if not diag_reg > 0:
    raise ValueError(f"the primal form needs diag_reg > 0, got {diag_reg}")
  gram = phi_train.T @ phi_train
  scale = 1.0 if diag_reg_absolute_scale else jnp.trace(gram) / phi_train.shape[0]
  return _primal_variance(gram, diag_reg * scale, phi_query)


@jax.jit
def _primal_variance(gram: Array, reg: Array, phi_query: Array) -> Array:
  lower = jnp.linalg.cholesky(gram + reg * jnp.eye(gram.shape[0], dtype=gram.dtype))
  a = jsl.solve_triangular(lower, phi_query.T, lower=True)  # L⁻¹ϕ: (d, M)
  return jnp.clip(reg * jnp.sum(a * a, axis=0), 0.0, jnp.sum(phi_query**2, axis=-1))
