"""Random network distillation (Burda et al. 2019) as an OOD score, in the CSD paper's shape.

The estimator is ``uncertainty_kit.novelty.rnd`` (the one the RL bonus trains online too): ``fit``
runs its ``update`` on sampled training batches, ``score`` is its ``score``.

A target net t, fixed at its random init, and a predictor p trained by squared error to match t
on the (normalised) training images. Score: the prediction error ‖p(x̃) − t(x̃)‖² / out_dim of
the normalised input x̃, high where p has not learnt t, i.e. away from the training data.

Shape (``uncertainty_kit.defaults.rnd``, the paper's baseline: "2 × 256 MLP predictor, 1-hidden-layer target, output
256, lr 3e-3", inputs normalised with training-set statistics):

* target: the CNN torso of the shared backbone (``defaults.BACKBONE["convs"]``, flattened), one
  hidden dense layer of 256, a linear 256-d output; never trained.
* predictor: the same torso (its own init, trained), 2 × 256 dense layers, 256-d output.
* Adam, lr 3e-3 annealed linearly to 0 over the budget; budget = the shared ``defaults.TRAIN``
  (``num_steps`` × ``batch_size``) unless ``num_steps`` / ``batch_size`` are set here.
* inputs x̃ = clip((x − μ) / σ, ±clip) with μ, σ from the training images, per pixel
  (``"pixel"``, as Burda et al.'s observation normalisation) or one scalar each (``"global"``);
  μ and σ are stored in the state, so ``score`` applies exactly what ``fit`` trained on.

``LEGACY_SHAPE`` restores the project's earlier RND (target and predictor both the full backbone
with a 64-d head, AdamW with a cosine schedule, raw inputs), for the comparison.

RND has no classifier of its own: ``predict`` uses the plain classifier of the same backbone and
budget that CSD and Laplace share.
"""

from __future__ import annotations

import functools
from typing import Mapping

import jax
import jax.numpy as jnp
import optax

from cmdline import cli
from csd_jax import checkpoint
from csd_jax import csd
from csd_jax import models
from uncertainty_kit import keys
from uncertainty_kit import novelty
from uncertainty_kit import train
from uncertainty_kit.interface import MethodState

Array = jax.Array

ANNEALS = ("linear", "cosine", "constant")

# The project's earlier RND: both nets the full backbone (its one 128 layer) with a 64-d head,
# AdamW (weight decay 1e-4) with the classifier's cosine schedule, raw inputs. Merge it into the
# default config (``methods.config_for("rnd", LEGACY_SHAPE)``) to reproduce that model.
LEGACY_SHAPE = {
    "predictor_widths": [128],
    "target_widths": [128],
    "out_dim": 64,
    "anneal": "cosine",
    "weight_decay": 1e-4,
    "normalize_inputs": "none",
}

# ----------------------------------------------------------------------------------------------
# Config checks: every key that changes the model, with a ValueError naming it.
# ----------------------------------------------------------------------------------------------


def _positive_int(config, key, *, allow_none=False):
  v = config[key]
  if v is None and allow_none:
    return None
  if isinstance(v, bool) or not isinstance(v, int) or v < 1:
    raise ValueError(
        f"rnd config {key!r} must be a positive int"
        f"{' or None' if allow_none else ''}, got {v!r}"
    )
  return v


def _widths(config, key, *, allow_empty):
  v = config[key]
  if (
      not isinstance(v, (list, tuple))
      or (not v and not allow_empty)
      or any(isinstance(w, bool) or not isinstance(w, int) or w < 1 for w in v)
  ):
    raise ValueError(
        f"rnd config {key!r} must be a {'' if allow_empty else 'non-empty '}"
        f"list of positive ints, got {v!r}"
    )
  return tuple(int(w) for w in v)


def _number(config, key, *, positive, allow_none=False):
  v = config[key]
  if v is None and allow_none:
    return None
  ok = isinstance(v, (int, float)) and not isinstance(v, bool) and (v > 0 if positive else v >= 0)
  if not ok:
    raise ValueError(
        f"rnd config {key!r} must be a {'positive' if positive else 'non-negative'} "
        f"number{' or None' if allow_none else ''}, got {v!r}"
    )
  return float(v)


def _choice(config, key, options):
  if config[key] not in options:
    raise ValueError(f"rnd config {key!r} must be one of {options}, got {config[key]!r}")
  return config[key]


def check_config(config: Mapping) -> None:
  """Raises ValueError naming the first RND key with an invalid value."""
  _widths(config, "predictor_widths", allow_empty=False)
  _widths(config, "target_widths", allow_empty=True)
  _positive_int(config, "out_dim")
  _number(config, "lr", positive=True)
  _choice(config, "anneal", ANNEALS)
  _number(config, "weight_decay", positive=False)
  _choice(config, "normalize_inputs", csd.INPUT_NORMS)
  _number(config, "clip", positive=True, allow_none=True)
  _positive_int(config, "num_steps", allow_none=True)
  _positive_int(config, "batch_size", allow_none=True)


def specs(config) -> tuple[models.CNNSpec, models.CNNSpec]:
  """(predictor, target) specs: the backbone's conv torso, then each net's dense widths and a
  linear ``out_dim`` head. Checks the config first."""
  check_config(config)
  out_dim = int(config["out_dim"])
  pred = train.spec_from_config(
      config["backbone"],
      out_dim=out_dim,
      widths=_widths(config, "predictor_widths", allow_empty=False),
  )
  target = train.spec_from_config(
      config["backbone"], out_dim=out_dim, widths=_widths(config, "target_widths", allow_empty=True)
  )
  return pred, target


def budget(config) -> dict:
  """The predictor's num_steps and batch_size: RND's own when set, else the shared budget."""
  kw = train.train_kwargs(config)
  steps = config["num_steps"] if config["num_steps"] is not None else kw["num_steps"]
  batch = config["batch_size"] if config["batch_size"] is not None else kw["batch_size"]
  return {"num_steps": int(steps), "batch_size": int(batch)}


# ----------------------------------------------------------------------------------------------
# Fit and score: the online estimator of ``novelty.rnd``, trained on sampled training batches.
# ----------------------------------------------------------------------------------------------


def _schedule(lr: float, anneal: str, num_steps: int):
  if anneal == "linear":
    return optax.linear_schedule(lr, 0.0, max(num_steps, 1))
  if anneal == "cosine":
    return optax.cosine_decay_schedule(lr, max(num_steps, 1))
  return optax.constant_schedule(lr)


@functools.lru_cache(maxsize=16)
def estimator(
    pred_spec,
    target_spec,
    lr: float = 3e-3,
    anneal: str = "linear",
    weight_decay: float = 0.0,
    num_steps: int = 1,
) -> novelty.Novelty:
  """RND of these nets trained by AdamW (``lr`` annealed over ``num_steps``)."""
  tx = optax.adamw(_schedule(lr, anneal, num_steps), weight_decay=weight_decay)
  return novelty.rnd(pred_spec, target_spec, tx)


@functools.lru_cache(maxsize=16)
def _step(rnd: novelty.Novelty, batch_size: int, clip):
  """The jitted step(carry, key) -> (carry, loss), carry = (``novelty.RNDState``, raw images
  (N, H, W, C), μ, σ): a minibatch sampled and normalised on device, one ``rnd.update``."""

  def step(carry, key):
    state, images, mean, std = carry
    idx = jax.random.randint(key, (batch_size,), 0, images.shape[0])
    state, metrics = rnd.update(state, csd.standardize(images[idx], mean, std, clip))
    return (state, images, mean, std), metrics["loss"]

  return jax.jit(step)


def _clip(config) -> float | None:
  return None if config["clip"] is None else float(config["clip"])


def fit(key, data, config, context=None, run: train.RunOptions = train.DEFAULT_RUN) -> MethodState:
  """Fits the predictor to the fixed target on ``data.images`` (N, H, W, C).

  Returns a state with arrays ``predictor``, ``target`` (flax params), ``input_mean`` and
  ``input_std`` ((H, W, C) each: the normalisation ``score`` applies) and ``classifier``.
  """
  del context
  pred_spec, target_spec = specs(config)
  b = budget(config)
  kw = train.train_kwargs(config)
  # rnd.init(key) draws its nets from split(key)[0], [1], which (JAX's partitionable threefry,
  # the default) equal split(key, 3)[0], [1]; the third key drives the batches.
  k_loop = jax.random.split(key, 3)[2]
  k_cls = keys.classifier_key(key)
  rnd = estimator(
      pred_spec,
      target_spec,
      float(config["lr"]),
      config["anneal"],
      float(config["weight_decay"]),
      b["num_steps"],
  )
  step = _step(rnd, b["batch_size"], _clip(config))
  images = jnp.asarray(data.images)
  mean, std = csd.input_stats(images, config["normalize_inputs"])
  state = rnd.init(key, csd.standardize(images[:1], mean, std, _clip(config)))
  ckpt = run.sub("predictor").periodic(
      lambda: dict(
          kind="rnd",
          config=cli.to_dict(config),
          key=checkpoint.key_id(key),
          data=checkpoint.fingerprint(images),
      )
  )
  carry = train.place(run, (state, images, mean, std))
  (state, _, _, _), _ = train.fit_loop(step, carry, jax.random.split(k_loop, b["num_steps"]), ckpt)
  classifier, _ = train.cached_classifier(
      k_cls,
      train.classifier_spec(config),
      data.images,
      data.labels,
      run=run.sub("classifier"),
      **kw,
  )
  return MethodState(
      arrays={
          "predictor": state.predictor,
          "target": state.target,
          "input_mean": mean,
          "input_std": std,
          "classifier": classifier,
      },
      config=config,
  )


def score(state: MethodState, x) -> jax.Array:
  """Prediction error ‖p(x̃) − t(x̃)‖² / out_dim: (B, H, W, C) → (B,)."""
  rnd = estimator(*specs(state.config))  # score needs the nets only, not the optimizer
  x = csd.standardize(x, state.arrays["input_mean"], state.arrays["input_std"], _clip(state.config))
  return rnd.score(novelty.RNDState(state.arrays["target"], state.arrays["predictor"], None), x)


def predict(state: MethodState, x) -> jax.Array:
  net = models.module(train.classifier_spec(state.config))
  return jax.nn.softmax(net.apply(state.arrays["classifier"], x), axis=-1)
