"""Intrinsic-reward bonuses for the DQN learner, as triples of pure functions.

A ``Bonus`` is ``(init, update, reward)``::

    state = bonus.init(key, obs_example)          # obs_example: (B, ...) preprocessed floats
    state, metrics = bonus.update(state, obs)     # one training step on a batch (B, ...)
    r = bonus.reward(state, obs)                  # (B,) intrinsic reward of each observation

All three are jit-able (``rl.dqn.update`` runs ``update`` and ``reward`` inside the learner's
single jitted update). Observations are the preprocessed network inputs
(``rl.networks.preprocess``: NHWC float pixels in [0, 1] or float vectors).

* ``none``: reward 0, no state.
* ``csd``: Contextual Similarity Distillation (``csd_jax.csd``). The prior f is a fixed random
  net of ``prior_spec`` (for pixels the Nature-DQN torso); the labels are its last-layer NTK
  Θ_L(x, c) = ϕ̃(x)·ϕ̃(c); g(x, c) = ϕ̂(x)ᵀ W ϕ̂(c) is trained online on replay observations
  (x and context c from the same replay batch, C = X) with ``csd.train_step``; the reward is the
  CSD estimate of the infinite ensemble's predictive variance, V(x) = Θ_L(x, x) − g(x, x).
  Never-seen observations keep V ≈ Θ_L(x, x); replayed ones fall towards the NTK-GP posterior
  variance.
* ``rnd``: random network distillation (Burda et al. 2019): a predictor net regresses a fixed
  random target net's output; the reward is the squared prediction error.

``RunningStats`` / ``normalize``: the learner divides each bonus by a running standard
deviation of its raw values, so one ``bonus_coef`` works across bonuses and environments.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from csd_jax import csd
from csd_jax import models

Array = jax.Array
PyTree = Any

KINDS = ("none", "csd", "rnd")


class Bonus(NamedTuple):
  """An intrinsic reward as pure functions (module docstring)."""
  init: Callable[[Array, Array], PyTree]
  update: Callable[[PyTree, Array], tuple[PyTree, dict]]
  reward: Callable[[PyTree, Array], Array]


def none_bonus() -> Bonus:
  """Reward 0 everywhere (plain DQN, BDQN+P)."""
  return Bonus(init=lambda key, obs: {},
               update=lambda state, obs: (state, {}),
               reward=lambda state, obs: jnp.zeros((obs.shape[0],), jnp.float32))


def csd_bonus(prior_spec: models.Spec, optimizer: optax.GradientTransformation | None = None
              ) -> Bonus:
  """CSD variance of the observation (module docstring); ``optimizer`` None: CSD's default
  (SGD with Nesterov momentum, exact for the linear form g = ϕ̂ᵀWϕ̂)."""
  model = csd.CSD(prior=prior_spec, optimizer=optimizer)

  def init(key: Array, obs: Array) -> csd.CSDState:
    return csd.init(model, key, obs)

  def update(state: csd.CSDState, obs: Array) -> tuple[csd.CSDState, dict]:
    state, metrics = csd.train_step(model, state, obs, obs)
    return state, {"bonus_loss": metrics["loss"]}

  def reward(state: csd.CSDState, obs: Array) -> Array:
    return csd.variance(model, state, obs, batch_size=max(1, obs.shape[0]))[0]

  return Bonus(init, update, reward)


class RNDState(NamedTuple):
  target: PyTree       # fixed random net
  predictor: PyTree
  opt_state: PyTree


def rnd_bonus(spec: models.Spec, out_dim: int = 64, learning_rate: float = 1e-4) -> Bonus:
  """Random network distillation on nets of ``spec`` (head replaced by ``out_dim`` outputs)."""
  net = models.module(dataclasses.replace(spec, out_dim=out_dim, dropout_rate=0.0))
  tx = optax.adam(learning_rate)

  def error(predictor: PyTree, target: PyTree, obs: Array) -> Array:
    diff = net.apply(predictor, obs) - jax.lax.stop_gradient(net.apply(target, obs))
    return jnp.mean(diff ** 2, axis=-1)

  def init(key: Array, obs: Array) -> RNDState:
    k_t, k_p = jax.random.split(key)
    predictor = net.init(k_p, obs[:1])
    return RNDState(target=net.init(k_t, obs[:1]), predictor=predictor,
                    opt_state=tx.init(predictor))

  def update(state: RNDState, obs: Array) -> tuple[RNDState, dict]:
    value, grads = jax.value_and_grad(
        lambda p: jnp.mean(error(p, state.target, obs)))(state.predictor)
    updates, opt_state = tx.update(grads, state.opt_state, state.predictor)
    return RNDState(state.target, optax.apply_updates(state.predictor, updates), opt_state), {
        "bonus_loss": value}

  def reward(state: RNDState, obs: Array) -> Array:
    return error(state.predictor, state.target, obs)

  return Bonus(init, update, reward)


def make(kind: str, spec: models.Spec | None, *, rnd_dim: int = 64, rnd_lr: float = 1e-4,
         csd_lr: float = 0.0) -> Bonus:
  """The bonus ``kind`` ("none" | "csd" | "rnd") on nets of ``spec``. ``csd_lr`` > 0 replaces
  CSD's default optimizer by SGD with that step size (Nesterov momentum 0.99, as the default)
  after a global-norm clip at 1."""
  if kind == "none":
    return none_bonus()
  if spec is None:
    raise ValueError(f"bonus {kind!r} needs a spec")
  if kind == "csd":
    # Online, the features of new observations can exceed those CSD's step size was set for
    # (the label scale is fixed at init): the clip keeps one outlier batch from diverging.
    opt = (optax.chain(optax.clip_by_global_norm(1.0),
                       optax.sgd(csd_lr, momentum=0.99, nesterov=True)) if csd_lr > 0 else None)
    return csd_bonus(spec, opt)
  if kind == "rnd":
    return rnd_bonus(spec, rnd_dim, rnd_lr)
  raise ValueError(f"bonus must be one of {KINDS}, got {kind!r}")


class RunningStats(NamedTuple):
  """Exponentially weighted mean and mean square of the raw bonus (a true running average while
  fewer than 1/rate batches have been seen)."""
  mean: Array
  mean_sq: Array
  count: Array


def init_stats() -> RunningStats:
  z = lambda: jnp.zeros((), jnp.float32)  # three buffers: the state may be donated
  return RunningStats(z(), z(), z())


def update_stats(stats: RunningStats, x: Array, weight: Array, rate: float = 0.01
                 ) -> RunningStats:
  """Folds in the weighted batch ``x`` (any shape, ``weight`` broadcastable to it)."""
  w = jnp.broadcast_to(weight, x.shape).astype(jnp.float32)
  total = jnp.maximum(jnp.sum(w), 1e-12)
  m, m2 = jnp.sum(w * x) / total, jnp.sum(w * x * x) / total
  alpha = jnp.where(jnp.sum(w) > 0, jnp.maximum(1.0 / (stats.count + 1.0), rate), 0.0)
  return RunningStats(stats.mean + alpha * (m - stats.mean),
                      stats.mean_sq + alpha * (m2 - stats.mean_sq),
                      stats.count + (jnp.sum(w) > 0))


def scale(stats: RunningStats) -> Array:
  """The running std, floored at 1% of the running RMS (so a constant bonus stays finite)."""
  var = jnp.maximum(stats.mean_sq - stats.mean ** 2, 0.0)
  return jnp.maximum(jnp.sqrt(var), 0.01 * jnp.sqrt(stats.mean_sq)) + 1e-8


def normalize(stats: RunningStats, x: Array) -> Array:
  return x / scale(stats)
