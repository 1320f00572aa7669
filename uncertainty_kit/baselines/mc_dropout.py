"""MC dropout (Gal & Ghahramani 2016): one classifier trained with dropout, k stochastic passes.

Dropout (rate ``dropout_rate``) follows every hidden activation of the backbone, in training and
at test time. The test-time masks come from a key fixed at ``fit`` (stored in the state), so
``score`` is a pure function of (state, x). Default score: predictive entropy, and rate 0.25:
the best of those tried on the embedded benchmark (docs/results.md).
"""

from __future__ import annotations

import jax

from csd_jax import models
from uncertainty_kit import keys
from uncertainty_kit import scores
from uncertainty_kit import train
from uncertainty_kit.interface import MethodState


def _spec(config):
  return train.classifier_spec(config, dropout_rate=float(config["dropout_rate"]))


def fit(key, data, config, context=None, run: train.RunOptions = train.DEFAULT_RUN) -> MethodState:
  del context
  k_fit, k_mask = jax.random.split(key)
  params, _ = train.train_classifier(
      k_fit, _spec(config), data.images, data.labels, run=run, **train.train_kwargs(config)
  )
  return MethodState(arrays={"params": params, "mask_key": keys.key_array(k_mask)}, config=config)


def pass_logits(state: MethodState, x) -> jax.Array:
  """(k, B, 10) outputs of k dropout passes."""
  net = models.module(_spec(state.config))
  keys = jax.random.split(state.arrays["mask_key"], int(state.config["num_passes"]))
  logits = jax.lax.map(
      lambda k: net.apply(state.arrays["params"], x, deterministic=False, rngs={"dropout": k}), keys
  )
  return logits


def score(state: MethodState, x) -> jax.Array:
  return scores.sample_uncertainty(pass_logits(state, x), state.config["score"])


def predict(state: MethodState, x) -> jax.Array:
  return jax.nn.softmax(pass_logits(state, x), axis=-1).mean(0)
