"""The interface every uncertainty method implements: its state and its four parts.

A method's state is a ``MethodState``: ``arrays``, a pytree of nested dicts of arrays (what the
benchmark checkpoints with orbax), and ``config``, the method's frozen config (an
``ml_collections.FrozenConfigDict``, hashable: ``cmdline.cli.freeze``) carried as static
pytree metadata. So ``jax.jit(method.score)(state, x)`` works, and a restored checkpoint plus
the config recorded next to it rebuild the state exactly.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import flax.struct
import jax
import ml_collections

Array = jax.Array


@flax.struct.dataclass
class MethodState:
  """arrays: nested dicts of arrays (checkpointed). config: static ``FrozenConfigDict``."""

  arrays: Any
  config: ml_collections.FrozenConfigDict = flax.struct.field(pytree_node=False)


class Method(NamedTuple):
  """``fit(key, train, config, context=None, run=...) -> MethodState`` (``config`` frozen);
  ``score(state, x (B, 28, 28, 1)) -> (B,)``, higher = more out-of-distribution;
  ``predict(state, x) -> (B, 10)`` class probabilities; ``default_config`` (frozen)."""

  fit: Callable[..., MethodState]
  score: Callable[[MethodState, Array], Array]
  predict: Callable[[MethodState, Array], Array]
  default_config: ml_collections.FrozenConfigDict
  uses_context: bool = False
  description: str = ""
  # (raw, relative) ``score`` kinds under which the method's score is the variance of the network
  # output, the quantity the NTK-GP formula and CSD describe (None: no such score): the
  # benchmark also scores every method with them, to compare all on CSD's own terms.
  output_variance_scores: tuple[str, str] | None = None
