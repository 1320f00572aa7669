"""Online novelty estimators: an uncertainty method as three pure, jit-able functions.

A ``Novelty`` is ``(init, update, score)``::

    state = novelty.init(key, x_example)       # x_example: (B, ...) network inputs
    state, metrics = novelty.update(state, x)  # one training step on a batch (B, ...)
    state, metrics = novelty.update(state, x, c)  # CSD only: contexts c (B, ...) paired with x
    s = novelty.score(state, x)                # (B,) novelty of each input (higher = newer)

The same triple serves both users of the kit: the OOD baseline ``baselines.rnd`` fits by
calling ``update`` on sampled training batches and scores with ``score``, and the RL agents
(``rl.bonus``) call ``update`` on replay batches inside the learner's jitted update and use
``score`` as an intrinsic reward. ``metrics`` holds ``"loss"`` (empty for ``none``). ``score``
also takes a ``csd_jax.models.OneHotProduct`` (every input paired with every one-hot action, on
MLP nets) and scores its B * num inputs at about the cost of B.

* ``none``: score 0, no state.
* ``csd``: Contextual Similarity Distillation trained online (``csd_jax.csd``; the inputs of a
  batch are also its contexts, C = X, unless contexts are given, e.g. augmented inputs: CSD-Aug);
  the score is the CSD estimate of the infinite ensemble's
  predictive variance V(x) = k(x, x) − g(x, x). Unseen inputs keep V ≈ k(x, x); trained-on ones
  fall towards the NTK-GP posterior variance.
* ``rnd``: random network distillation (Burda et al. 2019): a predictor net regresses a fixed
  random target net's output by squared error; the score is the mean squared prediction error.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from csd_jax import csd as csd_lib
from csd_jax import models

Array = jax.Array
PyTree = Any


class Novelty(NamedTuple):
  """An online novelty estimator as pure functions (module docstring)."""

  init: Callable[[Array, Array], PyTree]
  update: Callable[..., tuple[PyTree, dict]]  # (state, x, contexts=None)
  score: Callable[[PyTree, Array], Array]


def _no_contexts(kind: str, contexts: Array | None) -> None:
  if contexts is not None:
    raise ValueError(f"the {kind} novelty has no contexts; only csd takes them")


def none() -> Novelty:
  """Score 0 everywhere."""

  def update(state, x, contexts=None):
    _no_contexts("none", contexts)
    return state, {}

  return Novelty(
      init=lambda key, x: {},
      update=update,
      score=lambda state, x: jnp.zeros((x.shape[0],), jnp.float32),
  )


def csd(model: csd_lib.CSD) -> Novelty:
  """The CSD variance of estimator ``model`` (``csd_jax.csd.CSD``: the linear form g = ϕ̂ᵀWϕ̂
  on a prior's features, or the deep form with free towers), trained with the inputs of each
  batch as its contexts, or with the ``contexts`` given (same leading size; the deep form pairs
  c_i with x_i on the diagonal of its loss)."""

  def init(key: Array, x: Array) -> csd_lib.CSDState:
    return csd_lib.init(model, key, x)

  def update(
      state: csd_lib.CSDState, x: Array, contexts: Array | None = None
  ) -> tuple[csd_lib.CSDState, dict]:
    c = x if contexts is None else contexts
    if c.shape != x.shape:
      raise ValueError(f"contexts must have the inputs' shape {x.shape}, got {c.shape}")
    state, metrics = csd_lib.train_step(model, state, x, c)
    return state, {"loss": metrics["loss"]}

  def score(state: csd_lib.CSDState, x: Array) -> Array:
    return csd_lib.variance(model, state, x, batch_size=max(1, x.shape[0]))[0]

  return Novelty(init, update, score)


class RNDState(NamedTuple):
  target: PyTree  # fixed at its random init
  predictor: PyTree
  opt_state: PyTree


def rnd(
    predictor: models.Spec, target: models.Spec, optimizer: optax.GradientTransformation
) -> Novelty:
  """Random network distillation: a ``predictor`` net trained by ``optimizer`` to match a
  fixed ``target`` net (specs of ``csd_jax.models``; their ``out_dim`` must agree).

  ``init(key, x)`` draws the target from ``split(key)[0]`` and the predictor from
  ``split(key)[1]``; ``score``: ‖p(x) − t(x)‖² / out_dim, (B, ...) -> (B,)."""
  pred_net, target_net = models.module(predictor), models.module(target)

  def init(key: Array, x: Array) -> RNDState:
    k_target, k_pred = jax.random.split(key)
    params = pred_net.init(k_pred, x[:1])
    return RNDState(target_net.init(k_target, x[:1]), params, optimizer.init(params))

  def update(state: RNDState, x: Array, contexts: Array | None = None) -> tuple[RNDState, dict]:
    _no_contexts("rnd", contexts)
    y = target_net.apply(state.target, x)

    def loss(params):
      return jnp.mean((pred_net.apply(params, x) - y) ** 2)

    value, grads = jax.value_and_grad(loss)(state.predictor)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.predictor)
    return RNDState(state.target, optax.apply_updates(state.predictor, updates), opt_state), {
        "loss": value
    }

  def score(state: RNDState, x: Array) -> Array:
    diff = pred_net.apply(state.predictor, x) - target_net.apply(state.target, x)
    return jnp.mean(diff**2, axis=-1)

  return Novelty(init, update, score)
