"""Input checks for the public boundary: one clear ValueError naming the argument.

Shape and dtype checks run at trace time, so they cost nothing inside ``jax.jit``.
The finiteness check needs values: it runs on concrete arrays only and is skipped
for tracers (a jitted caller checks its inputs once, outside the jit).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


def is_concrete(x: Any) -> bool:
  """True for a value (numpy or committed jax array), False for a tracer."""
  return not isinstance(x, jax.core.Tracer)


def check_array(
    name: str,
    x: Any,
    *,
    rank: int | None = None,
    min_rank: int | None = None,
    floating: bool = True,
    finite: bool = True,
    nonempty: bool = True,
) -> None:
  """Raises ValueError naming ``name`` if ``x`` is not a suitable array.

  Args:
    name: the argument's name, used in the message.
    x: the value to check.
    rank / min_rank: required exact / minimum number of axes.
    floating: require a floating dtype.
    finite: require no NaN or Inf (concrete inputs only).
    nonempty: require a non-empty leading (batch) axis.
  """
  if not hasattr(x, "shape") or not hasattr(x, "dtype"):
    raise ValueError(f"{name} must be an array, got {type(x).__name__}")
  if rank is not None and x.ndim != rank:
    raise ValueError(f"{name} must have rank {rank}, got shape {tuple(x.shape)}")
  if min_rank is not None and x.ndim < min_rank:
    raise ValueError(f"{name} must have rank >= {min_rank}, got shape {tuple(x.shape)}")
  if floating and not jnp.issubdtype(x.dtype, jnp.floating):
    raise ValueError(f"{name} must have a floating dtype, got {x.dtype}")
  if nonempty and x.ndim >= 1 and x.shape[0] == 0:
    raise ValueError(f"{name} is empty (shape {tuple(x.shape)})")
  if finite and floating and is_concrete(x) and not bool(np.all(np.isfinite(np.asarray(x)))):
    raise ValueError(f"{name} contains NaN or Inf")
