"""Neural tangent kernels: finite-width (empirical), infinite-width, last-layer.

All kernels here are of scalar-output functions or, for several outputs, the kernel
averaged over the output axis (neural-tangents' ``trace_axes=(-1,)``), which in the
infinite-width limit equals the per-output kernel (outputs are i.i.d.).

* ``empirical_ntk``: Θ̂(x1, x2) = J(x1) J(x2)ᵀ at given params, via ``nt.empirical_ntk_fn``
  (``JACOBIAN_CONTRACTION`` or ``NTK_VECTOR_PRODUCTS``; ``STRUCTURED_DERIVATIVES`` is
  refused: it fails on the JAX versions measured, docs/design.md §3).
* ``jacobian_ntk``: the same kernel by an explicit ``jax.jacrev`` product; the reference
  the validation checks ``empirical_ntk`` against, and a fallback for odd models.
* ``infinite_kernels``: the infinite-width NTK and NNGP of a spec, from
  ``neural_tangents.stax`` (``models.stax_layers``).
* ``last_layer_ntk``: Θ_L(x1, x2) = ϕ̃(x1)·ϕ̃(x2), the NTK of the head's parameters only.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import chex
import jax
import jax.numpy as jnp

from csd_jax import _nt_compat
from csd_jax import models
from csd_jax.checks import check_array

Array = jax.Array
PyTree = Any
ApplyFn = Callable[[PyTree, Array], Array]

IMPLEMENTATIONS = ("jacobian_contraction", "ntk_vector_products")


def _implementation(name: str):
  nt = _nt_compat.nt()
  if name not in IMPLEMENTATIONS:
    raise ValueError(
        f"implementation must be one of {IMPLEMENTATIONS}, got {name!r} "
        "(structured_derivatives fails on current JAX and is not offered)"
    )
  return {
      "jacobian_contraction": nt.NtkImplementation.JACOBIAN_CONTRACTION,
      "ntk_vector_products": nt.NtkImplementation.NTK_VECTOR_PRODUCTS,
  }[name]


@functools.lru_cache(maxsize=64)
def empirical_ntk_fn(
    apply_fn: ApplyFn, implementation: str = "jacobian_contraction"
) -> Callable[[Array, Array | None, PyTree], Array]:
  """A jitted ``ntk(x1, x2, params) -> (N1, N2)`` for ``apply_fn(params, x)``.

  Cached per ``(apply_fn, implementation)`` so repeated calls reuse one compilation.
  ``x2=None`` means ``x2 = x1``.
  """
  nt = _nt_compat.nt()
  fn = nt.empirical_ntk_fn(
      apply_fn, trace_axes=(-1,), vmap_axes=0, implementation=_implementation(implementation)
  )
  return jax.jit(fn)


def empirical_ntk(
    apply_fn: ApplyFn,
    params: PyTree,
    x1: Array,
    x2: Array | None = None,
    implementation: str = "jacobian_contraction",
) -> Array:
  """Finite-width NTK Θ̂(x1, x2) = Σ_θ ∂f(x1)/∂θ ∂f(x2)/∂θ at ``params``.

  Args:
    apply_fn: ``apply_fn(params, x) -> (B, out_dim)``; keep the same function object
      between calls to reuse the compiled kernel.
    params: the parameters at which to take the Jacobians.
    x1: (N1, ...) inputs. x2: (N2, ...) inputs, or None for x1.
    implementation: ``"jacobian_contraction"`` or ``"ntk_vector_products"``.

  Returns:
    (N1, N2) kernel matrix, in the dtype of the outputs.
  """
  check_array("x1", x1, min_rank=2)
  if x2 is not None:
    check_array("x2", x2, min_rank=2)
    if x2.shape[1:] != x1.shape[1:]:
      raise ValueError(f"x2 must have per-example shape {x1.shape[1:]}, got {x2.shape[1:]}")
  return empirical_ntk_fn(apply_fn, implementation)(x1, x2, params)


def jacobian_ntk(apply_fn: ApplyFn, params: PyTree, x1: Array, x2: Array | None = None) -> Array:
  """Θ̂(x1, x2) by explicit Jacobians: ``J(x1) J(x2)ᵀ`` summed over all parameter leaves.

  Memory O((N1 + N2) · P · out_dim); the reference for ``empirical_ntk``.
  """
  x2 = x1 if x2 is None else x2

  def jac(x):
    j = jax.jacrev(apply_fn)(params, x)  # leaves: (N, out, *leaf_shape)
    return [l.reshape(l.shape[0], l.shape[1], -1) for l in jax.tree_util.tree_leaves(j)]

  j1, j2 = jac(x1), jac(x2)
  out_dim = j1[0].shape[1]
  return sum(jnp.einsum("aop,bop->ab", a, b) for a, b in zip(j1, j2)) / out_dim


def infinite_kernels(
    spec: models.Spec, x1: Array, x2: Array | None = None, get: tuple[str, ...] = ("ntk", "nngp")
):
  """Infinite-width kernels of ``spec`` from neural-tangents.

  Returns a namedtuple-like ``Kernel`` with fields ``get`` (e.g. ``.ntk``, ``.nngp``),
  each (N1, N2). The NTK is the prior covariance of the NTK-GP (He et al. 2020); the
  NNGP kernel is the covariance of the network function at initialisation.
  """
  check_array("x1", x1, min_rank=2)
  if x2 is not None:
    check_array("x2", x2, min_rank=2)
  _, _, kernel_fn = models.stax_layers(spec)
  return kernel_fn(x1, x2, get)


def last_layer_ntk(spec: models.Spec, params: PyTree, x1: Array, x2: Array | None = None) -> Array:
  """Θ_L(x1, x2) = ϕ̃(x1)·ϕ̃(x2): (N1, N2), the NTK of the head's parameters at ``params``."""
  f1 = models.last_layer_features(spec, params, x1)
  f2 = f1 if x2 is None else models.last_layer_features(spec, params, x2)
  chex.assert_equal_shape_suffix([f1, f2], 1)
  return f1 @ f2.T
