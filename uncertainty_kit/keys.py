"""PRNG keys the methods share or store."""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array


def classifier_key(key: Array) -> Array:
  """The key of the plain classifier that CSD, RND and Laplace share (the same for all three, so
  ``train.cached_classifier`` trains it once per seed)."""
  return jax.random.fold_in(key, 0x5EED)


def key_array(key: Array) -> Array:
  """A raw uint32 key (checkpointable) from a typed or raw PRNG key."""
  if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
    return jax.random.key_data(key)
  return key
