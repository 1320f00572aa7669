"""Intrinsic rewards for the DQN learner: the kit's online novelty estimators, set up for RL.

A bonus is an ``uncertainty_kit.novelty.Novelty`` triple of pure, jit-able functions::

    state = bonus.init(key, obs_example)          # obs_example: (B, ...) preprocessed floats
    state, metrics = bonus.update(state, obs)     # one training step on a batch (B, ...)
    r = bonus.score(state, obs)                   # (B,) intrinsic reward of each observation

``rl.dqn.update`` runs ``update`` and ``score`` inside the learner's single jitted update.
Observations are the preprocessed network inputs (``rl.networks.preprocess``: NHWC float pixels
in [0, 1] or float vectors).

* ``none``: reward 0, no state.
* ``csd``: CSD on a fixed random prior net of ``spec`` (for pixels the Nature-DQN torso), the
  labels its last-layer NTK; g is trained on the replay batch's inputs (C = X) and the reward is
  the CSD variance V(x) = Θ_L(x, x) − g(x, x). Without ``csd_towers`` g is linear on the prior's
  last-layer features (ϕ̂ᵀWϕ̂); with them it is the paper's deep form: free towers φ, ψ of that
  spec, unit-normalised, the diagonal-weighted pair loss, Adam (``csd_jax.csd.CSD.deep``).
* ``rnd``: random network distillation, predictor and target both nets of ``spec`` with an
  ``rnd_dim`` head, the predictor trained by Adam; the reward is the squared prediction error.

``pair_inputs`` turns (observation, action) into one network input, for bonuses of state-action
pairs (the paper's agent): the action's one-hot vector is appended to a flat observation, or
broadcast as extra channels of an image; ``all_pairs`` pairs each observation with every action
(on flat observations without materialising the pairs).

``RunningStats`` / ``normalize``: the learner divides each bonus by a running standard
deviation of its raw values, so one ``bonus_coef`` works across bonuses and environments.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from csd_jax import csd as csd_lib
from csd_jax import models
from csd_jax.checks import check_array
from uncertainty_kit import novelty

Array = jax.Array
Bonus = novelty.Novelty

KINDS = ("none", "csd", "rnd")


def make(
    kind: str,
    spec: models.Spec | None,
    *,
    rnd_dim: int = 64,
    rnd_lr: float = 1e-4,
    csd_lr: float = 0.0,
    csd_towers: models.Spec | None = None,
    csd_embed_dim: int = 64,
) -> Bonus:
  """The bonus ``kind`` ("none" | "csd" | "rnd") on nets of ``spec``.

  Linear CSD (``csd_towers`` None): ``csd_lr`` > 0 replaces CSD's default optimizer by SGD with
  that step size (Nesterov momentum 0.99, as the default) after a global-norm clip at 1. Deep
  CSD: towers of spec ``csd_towers`` with ``csd_embed_dim`` outputs, Adam with step size
  ``csd_lr`` (0: 1e-3)."""
  if kind == "none":
    return novelty.none()
  if spec is None:
    raise ValueError(f"bonus {kind!r} needs a spec")
  if kind == "csd" and csd_towers is not None:
    return novelty.csd(
        csd_lib.CSD(
            prior=spec,
            feature_net=csd_towers,
            context_net=csd_towers,
            embed_dim=csd_embed_dim,
            normalize=True,
            loss_weighting="diagonal",
            optimizer=optax.adam(csd_lr or 1e-3),
        )
    )
  if kind == "csd":
    # Online, the features of new observations can exceed those CSD's step size was set for
    # (the label scale is fixed at init): the clip keeps one outlier batch from diverging.
    opt = (
        optax.chain(optax.clip_by_global_norm(1.0), optax.sgd(csd_lr, momentum=0.99, nesterov=True))
        if csd_lr > 0
        else None
    )
    return novelty.csd(csd_lib.CSD(prior=spec, optimizer=opt))
  if kind == "rnd":
    net = dataclasses.replace(spec, out_dim=rnd_dim, dropout_rate=0.0)
    return novelty.rnd(net, net, optax.adam(rnd_lr))
  raise ValueError(f"bonus must be one of {KINDS}, got {kind!r}")


def pair_inputs(x: Array, actions: Array, num_actions: int) -> Array:
  """Network inputs of (observation, action) pairs. ``x``: preprocessed (B, D) vectors or
  (B, H, W, C) images; ``actions``: (B,) int. Returns (B, D + A), or (B, H, W, C + A) with the
  one-hot action constant over the image."""
  check_array("actions", actions, rank=1, floating=False)
  if x.shape[0] != actions.shape[0]:
    raise ValueError(
        f"x and actions need one row per pair, got {x.shape[0]} and " f"{actions.shape[0]}"
    )
  onehot = jax.nn.one_hot(actions, num_actions, dtype=x.dtype)
  if x.ndim == 2:
    return jnp.concatenate([x, onehot], axis=-1)
  if x.ndim == 4:
    planes = jnp.broadcast_to(onehot[:, None, None, :], (*x.shape[:3], num_actions))
    return jnp.concatenate([x, planes], axis=-1)
  raise ValueError(f"x must be (B, D) or (B, H, W, C), got shape {x.shape}")


def all_pairs(x: Array, num_actions: int) -> Array | models.OneHotProduct:
  """``pair_inputs`` of every action at every observation: (B * A, ...), row b * A + a. For flat
  x (B, D) a ``models.OneHotProduct``, which the bonus's MLPs score at about the cost of B inputs
  (``models.as_array`` materialises it); for images the materialised planes."""
  if x.ndim == 2:
    return models.OneHotProduct(x, num_actions)
  rep = jnp.repeat(x, num_actions, axis=0)
  return pair_inputs(rep, jnp.tile(jnp.arange(num_actions), x.shape[0]), num_actions)


class RunningStats(NamedTuple):
  """Exponentially weighted mean and mean square of the raw bonus (a true running average while
  fewer than 1/rate batches have been seen)."""

  mean: Array
  mean_sq: Array
  count: Array


def init_stats() -> RunningStats:
  z = lambda: jnp.zeros((), jnp.float32)  # three buffers: the state may be donated
  return RunningStats(z(), z(), z())


def update_stats(stats: RunningStats, x: Array, weight: Array, rate: float = 0.01) -> RunningStats:
  """Folds in the weighted batch ``x`` (any shape, ``weight`` broadcastable to it)."""
  w = jnp.broadcast_to(weight, x.shape).astype(jnp.float32)
  total = jnp.maximum(jnp.sum(w), 1e-12)
  m, m2 = jnp.sum(w * x) / total, jnp.sum(w * x * x) / total
  alpha = jnp.where(jnp.sum(w) > 0, jnp.maximum(1.0 / (stats.count + 1.0), rate), 0.0)
  return RunningStats(
      stats.mean + alpha * (m - stats.mean),
      stats.mean_sq + alpha * (m2 - stats.mean_sq),
      stats.count + (jnp.sum(w) > 0),
  )


def scale(stats: RunningStats) -> Array:
  """The running std, floored at 1% of the running RMS (so a constant bonus stays finite)."""
  var = jnp.maximum(stats.mean_sq - stats.mean**2, 0.0)
  return jnp.maximum(jnp.sqrt(var), 0.01 * jnp.sqrt(stats.mean_sq)) + 1e-8


def normalize(stats: RunningStats, x: Array) -> Array:
  return x / scale(stats)
