"""What every uncertainty method shares: its state type, the backbone and budget, the scores.

A method's state is a ``MethodState``: ``arrays``, a pytree of nested dicts of arrays (what the
benchmark checkpoints with orbax), and ``config``, an ``ml_collections.FrozenConfigDict``
(hashable) carried as static pytree metadata. So ``jax.jit(method.score)(state, x)`` works and
a restored checkpoint plus the config recorded next to it rebuild the state exactly.

Configs have two forms: a ``ConfigDict`` is edited (config files, command-line overrides,
``methods.config_for``); ``freeze`` gives the ``FrozenConfigDict`` every ``fit`` works with.
"""

from __future__ import annotations

import json
from typing import Any, Mapping

import flax.struct
import jax
import jax.numpy as jnp
import ml_collections
from ml_collections import config_dict

from csd_jax import csd
from uncertainty_kit import train

Array = jax.Array

NUM_CLASSES = 10

# The one backbone family for every method: a small MNIST CNN (two strided 5×5 convolutions,
# one hidden dense layer), standard parameterisation (plain AdamW training), ~0.2 M params.
BACKBONE = {
    "convs": ((16, 5, 2), (32, 5, 2)),
    "widths": (128,),
    "padding": "SAME",
    "activation": "relu",
    "parameterization": "standard",
    "w_std": 2.0**0.5,
    "b_std": 0.1,
}

# The per-network training budget every method gets: num_steps × batch_size examples
# (300 × 128 ≈ 10 epochs of the 4,000 embedded training digits).
TRAIN = {"num_steps": 300, "batch_size": 128, "lr": 3e-3, "weight_decay": 1e-4}

# Functionals of the class probabilities p = softmax(z) of S samples (members, passes, posterior
# draws), and of the raw outputs z: the quantity the NTK-GP (and so CSD) describes is the
# variance of the network output, so the logit kinds compare ensembles with CSD on CSD's terms.
PROBABILITY_KINDS = ("variance", "mutual_information", "entropy", "max_prob")
LOGIT_KINDS = ("logit_variance", "relative_logit_variance")
SCORE_KINDS = PROBABILITY_KINDS + LOGIT_KINDS


@flax.struct.dataclass
class MethodState:
  """arrays: nested dicts of arrays (checkpointed). config: static ``FrozenConfigDict``."""

  arrays: Any
  config: ml_collections.FrozenConfigDict = flax.struct.field(pytree_node=False)


def freeze(config: Mapping | ml_collections.ConfigDict) -> ml_collections.FrozenConfigDict:
  """The hashable form of a (nested) dict or ConfigDict; lists become tuples.

  Built from the plain values, so equal values give equal, equally hashed configs whatever the
  source's ConfigDict settings (a FrozenConfigDict compares those too)."""
  return ml_collections.FrozenConfigDict(to_dict(config))


def to_dict(config) -> dict:
  """Plain JSON values (dicts, lists) of a config, for results and checkpoint identities."""
  if isinstance(config, ml_collections.ConfigDict):
    return json.loads(config.to_json_best_effort())
  return json.loads(json.dumps(config))


def editable(config) -> ml_collections.ConfigDict:
  """An editable ``ConfigDict`` copy, every field overridable on the command line: a None field
  becomes a placeholder that takes any literal (``--config.method.rnd.num_steps=300``)."""

  def field(v):
    if isinstance(v, dict):
      return {k: field(x) for k, x in v.items()}
    if isinstance(v, list):  # the command line overrides tuples, not lists
      return tuple(field(x) for x in v)
    return config_dict.placeholder(object) if v is None else v

  return ml_collections.ConfigDict(field(to_dict(config)))


def replace(config, **updates) -> ml_collections.FrozenConfigDict:
  """``config`` with top-level fields replaced (each must exist)."""
  missing = sorted(set(updates) - set(config.keys()))
  if missing:
    raise ValueError(f"unknown config keys {missing}; valid keys: {sorted(config.keys())}")
  return freeze({**to_dict(config), **updates})


def common_config() -> dict:
  """The shared part of every method's default config (fresh copies)."""
  return {"backbone": dict(BACKBONE), "train": dict(TRAIN)}


def classifier_spec(config, **overrides):
  return train.spec_from_config(config["backbone"], out_dim=NUM_CLASSES, **overrides)


def train_kwargs(config) -> dict:
  t = config["train"]
  return dict(
      num_steps=int(t["num_steps"]),
      batch_size=int(t["batch_size"]),
      lr=float(t["lr"]),
      weight_decay=float(t["weight_decay"]),
  )


def sample_uncertainty(logits: Array, kind: str) -> Array:
  """Uncertainty of S samples of a classifier's outputs (higher = more OOD).

  Args:
    logits: (S, B, K) outputs z of S members / passes / posterior samples; p = softmax(z).
    kind: of the probabilities: ``"variance"``: Σ_k Var_s p_k, the total predictive variance;
      ``"mutual_information"``: H(E_s p) − E_s H(p) (BALD, epistemic part); ``"entropy"``:
      H(E_s p), total; ``"max_prob"``: 1 − max_k E_s p_k. Of the outputs:
      ``"logit_variance"``: Σ_k Var_s z_k, the ensemble variance the NTK-GP formula (and CSD)
      describes; ``"relative_logit_variance"``: Σ_k Var_s z_k / Σ_k E_s z_k², its scale-free
      form (the fraction of the outputs' second moment the samples disagree on), the
      counterpart of CSD's V(x)/Θ(x,x).

  Returns:
    (B,) scores.
  """
  if kind not in SCORE_KINDS:
    raise ValueError(f"score kind must be one of {SCORE_KINDS}, got {kind!r}")
  if kind in LOGIT_KINDS:
    var = jnp.sum(logits.var(0), axis=-1)
    if kind == "logit_variance":
      return var
    return var / jnp.maximum(jnp.sum(jnp.mean(logits**2, 0), axis=-1), 1e-30)
  probs = jax.nn.softmax(logits, axis=-1)
  mean = probs.mean(0)
  ent = lambda p: -jnp.sum(p * jnp.log(jnp.clip(p, 1e-12)), axis=-1)
  if kind == "variance":
    return jnp.sum(probs.var(0), axis=-1)
  if kind == "mutual_information":
    return ent(mean) - ent(probs).mean(0)
  if kind == "entropy":
    return ent(mean)
  return 1.0 - mean.max(-1)


# Input normalisation (RND, deep CSD): x̃ = clip((x − μ) / σ) with training-set statistics;
# one implementation, csd_jax's (deep CSD keeps μ, σ in its state).
NORMALIZATIONS = csd.INPUT_NORMS
STD_FLOOR = csd.STD_FLOOR
input_stats = csd.input_stats
normalize_inputs = csd.standardize


def classifier_key(key: Array) -> Array:
  """The key of the plain classifier that CSD, RND and Laplace share (the same for all three, so
  ``train.cached_classifier`` trains it once per seed)."""
  return jax.random.fold_in(key, 0x5EED)


def key_array(key: Array) -> Array:
  """A raw uint32 key (checkpointable) from a typed or raw PRNG key."""
  if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
    return jax.random.key_data(key)
  return key
