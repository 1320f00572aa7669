"""Every uncertainty method behind one interface, and the registry the benchmarks loop over.

A ``Method`` is four things:

* ``fit(key, train: data.Dataset, config, context=None) -> MethodState``;
* ``score(state, x (B, 28, 28, 1)) -> (B,)`` uncertainty, higher = more out-of-distribution;
* ``predict(state, x) -> (B, 10)`` class probabilities (the accuracy column);
* ``default_config``: a dict; ``fit`` takes it, or ``train.merge(default_config, overrides)``.

``score`` and ``predict`` are pure and jit-able: ``jax.jit(method.score)(state, x)``. ``fit`` is a
Python loop over jitted steps. ``context`` is read only by methods with ``uses_context`` (CSD-OOD:
unlabeled inputs of the evaluation distributions, which the caller keeps disjoint from the
evaluated inputs).

Methods (all share the backbone ``common.BACKBONE`` and the per-network budget ``common.TRAIN``):

* ``csd``: Contextual Similarity Distillation (``csd_jax.csd``), context C = X. The prior f is the
  backbone classifier *at random init* (``prior="init"``); labels are its last-layer NTK Θ_L.
  Score (``score``): ``"variance"``, V(x) = Θ_L(x,x) − g(x,x), or ``"relative_variance"``,
  V(x)/Θ_L(x,x) ∈ [0, 1], the fraction of the prior variance the training data leaves unexplained.
  The ReLU prior's Θ_L(x,x) grows with the input's norm, so raw V ranks faint inputs (e.g. the
  resized sklearn digits) as in-distribution; the ratio removes that scale. CSD's variance is that of an (infinite) ensemble of heads on f's
  random features, so it has no classifier: ``predict`` uses a plain classifier of the same
  backbone trained with the same budget (the one RND and Laplace's MAP use, trained once).
* ``csd_aug``: contexts from X replaced, with probability ``extra_fraction``, by augmentations
  (``csd_jax.augment.random_augment`` at ``augment_strength``), drawn from a pool of
  ``augment_pool`` augmented copies of X made once at fit (``augmentation_pool``).
* ``csd_ood``: contexts drawn with probability ``extra_fraction`` from ``context``, else from X.
* Tower forms: ``towers="matched"`` (φ = the prior's frozen last-layer features, ψ linear; exact
  in the last-layer regime) or ``"free"`` (φ, ψ two backbone CNNs, the paper's deep recipe).
  ``csd``/``csd_aug``/``csd_ood`` use ``DEFAULT_TOWERS``; ``<name>_matched`` / ``<name>_free``
  name a form explicitly (the benchmark runs both to record the comparison).
* ``ens3``, ``ens15``: deep ensembles; ``mc_dropout``; ``laplace`` (last-layer, full GGN,
  laplax); ``rnd``: see ``csd_jax.baselines``.
"""

from __future__ import annotations

import functools
from typing import Callable, Mapping, NamedTuple

import jax
import jax.numpy as jnp
import optax

from csd_jax import augment as augment_lib
from csd_jax import csd
from csd_jax import models
from csd_jax import train
from csd_jax.baselines import common
from csd_jax.baselines import ensembles
from csd_jax.baselines import laplace
from csd_jax.baselines import mc_dropout
from csd_jax.baselines import rnd
from csd_jax.baselines.common import MethodState

Array = jax.Array

# Chosen by the embedded benchmark's AUROC (out/ood/ood.json "tower_comparison"; README).
DEFAULT_TOWERS = "matched"


class Method(NamedTuple):
  fit: Callable[..., MethodState]
  score: Callable[[MethodState, Array], Array]
  predict: Callable[[MethodState, Array], Array]
  default_config: Mapping
  uses_context: bool = False
  description: str = ""


# ----------------------------------------------------------------------------------------------
# CSD.
# ----------------------------------------------------------------------------------------------

CSD_CONTEXTS = ("train", "augment", "ood")


def csd_default_config(context: str = "train", towers: str = DEFAULT_TOWERS) -> dict:
  """CSD's defaults. ``num_steps``/``batch_size`` are g's own budget (Bx × Bc label blocks)."""
  if context not in CSD_CONTEXTS:
    raise ValueError(f"context must be one of {CSD_CONTEXTS}, got {context!r}")
  if towers not in ("matched", "free"):
    raise ValueError(f"towers must be 'matched' or 'free', got {towers!r}")
  return {
      **common.common_config(),
      "context": context,
      "towers": towers,
      "prior": "init",            # "init": f at random init (the paper); "trained": the classifier
      "score": "relative_variance",  # or "variance" (module docstring)
      "num_steps": 300 if towers == "matched" else common.TRAIN["num_steps"],
      "batch_size": 128,
      "context_batch_size": 128,
      "extra_fraction": 0.5,
      "augment_strength": 1.0,
      "augment_pool": 2,          # CSD-Aug: augmented copies per training image (0 = on the fly)
      "embed_dim": 128,           # free towers only
      "lr": 1e-3,                 # free towers only (Adam); matched: csd.default_optimizer
  }


@functools.lru_cache(maxsize=64)
def _csd_model(backbone: train.Config, towers: str, embed_dim: int, lr: float) -> csd.CSD:
  """One ``csd.CSD`` per configuration (it is a jit static argument: keep it identical)."""
  prior = train.spec_from_config(backbone, out_dim=common.NUM_CLASSES)
  if towers == "matched":
    return csd.CSD(prior=prior)
  tower = train.spec_from_config(backbone)
  return csd.CSD(prior=prior, feature_net=tower, context_net=tower, embed_dim=embed_dim,
                 optimizer=optax.adam(lr))


def csd_model(config) -> csd.CSD:
  config = train.freeze(config)
  return _csd_model(config["backbone"], config["towers"], int(config["embed_dim"]),
                    float(config["lr"]))


@functools.lru_cache(maxsize=8)
def _augment_fn(strength: float):
  if strength == 1.0:
    return augment_lib.default_augmentation
  return functools.partial(augment_lib.random_augment, strength=strength)


@functools.lru_cache(maxsize=32)
def _free_step(model: csd.CSD, batch_size: int, context_batch_size: int, extra_fraction: float,
               augment):
  """A jitted CSD step that samples its own batch (a Python loop calls it: see train.py on
  why not ``lax.scan``, which ``csd.fit`` uses, for trained conv towers on CPU)."""

  def step(carry, key):
    state, x_train, context = carry
    k_x, k_c = jax.random.split(key)
    x = x_train[jax.random.randint(k_x, (batch_size,), 0, x_train.shape[0])]
    c = csd._sample_contexts(k_c, x_train, context, augment, context_batch_size, extra_fraction)
    state, metrics = csd.train_step(model, state, x, c)
    return (state, x_train, context), metrics["loss"]

  return jax.jit(step)


@functools.lru_cache(maxsize=8)
def _jit_augment(fn):
  return jax.jit(fn)


def augmentation_pool(key, images, fn, copies: int, chunk: int = 512) -> Array:
  """``copies`` augmentations of every image: (copies · N, ...), computed in jitted chunks.

  CSD-Aug draws contexts from this pool (with probability ``extra_fraction``, else from X):
  the same distribution as augmenting each sampled context on the fly, with a finite pool;
  it keeps the (costly, on CPU) warps out of the training loop.
  """
  aug = _jit_augment(fn)
  out = []
  for r in range(copies):
    k = jax.random.fold_in(key, r)
    for i in range(0, images.shape[0], chunk):
      out.append(aug(jax.random.fold_in(k, i), images[i:i + chunk]))
  return jnp.concatenate(out)


def _csd_fit(key, data, config, context=None) -> MethodState:
  config = train.freeze(config)
  k_prior, k_fit = jax.random.split(key)
  k_cls = common.classifier_key(key)
  spec = common.classifier_spec(config)
  classifier, _ = train.cached_classifier(k_cls, spec, data.images, data.labels,
                                          **common.train_kwargs(config))
  model = csd_model(config)
  x_train = jnp.asarray(data.images)
  prior_params = {"init": None, "trained": classifier}[config["prior"]]
  state = csd.init(model, k_prior, x_train, prior_params=prior_params)
  ctx, aug = None, None
  if config["context"] == "ood":
    if context is None:
      raise ValueError("CSD-OOD needs context: unlabeled inputs of the evaluation distributions")
    ctx = jnp.asarray(context)
  elif config["context"] == "augment":
    aug = _augment_fn(float(config["augment_strength"]))
    if int(config["augment_pool"]) > 0:  # a fixed pool of augmentations, drawn as context
      ctx, aug = augmentation_pool(jax.random.fold_in(key, 2), x_train, aug,
                                   int(config["augment_pool"])), None
  steps, bx, bc = int(config["num_steps"]), int(config["batch_size"]), int(
      config["context_batch_size"])
  if config["towers"] == "matched":  # forward-only convolutions: csd.fit's lax.scan is fast
    state, _ = csd.fit(model, state, k_fit, x_train, num_steps=steps, batch_size=bx,
                       context_batch_size=bc, context=ctx, augment=aug,
                       extra_fraction=float(config["extra_fraction"]), log_every=steps,
                       verbose=False)
  else:
    step = _free_step(model, bx, bc, float(config["extra_fraction"]), aug)
    (state, _, _), _ = train.fit_loop(step, (state, x_train, ctx), k_fit, steps)
  params = dict(state.params)
  if not params.get("feature"):
    params.pop("feature", None)  # empty for matched towers; orbax does not keep empty dicts
  return MethodState(arrays={"towers": params, "prior": state.prior_params,
                             "label_scale": state.label_scale, "classifier": classifier},
                     config=config)


def csd_state(state: MethodState) -> csd.CSDState:
  """The ``csd.CSDState`` (without optimizer state) inside a CSD method's state."""
  params = dict(state.arrays["towers"])
  params.setdefault("feature", {})
  return csd.CSDState(params=params, opt_state=None, prior_params=state.arrays["prior"],
                      label_scale=state.arrays["label_scale"], step=jnp.zeros((), jnp.int32))


CSD_SCORES = ("variance", "relative_variance")


def _csd_score(state: MethodState, x) -> Array:
  model, cs = csd_model(state.config), csd_state(state)
  v = csd.variance(model, cs, x)[0]
  if state.config["score"] == "variance":
    return v
  if state.config["score"] != "relative_variance":
    raise ValueError(f"CSD score must be one of {CSD_SCORES}, got {state.config['score']!r}")
  return v / jnp.maximum(csd.prior_variance(model, cs.prior_params, x), 1e-12)


def _classifier_predict(state: MethodState, x) -> Array:
  net = models.module(common.classifier_spec(state.config))
  return jax.nn.softmax(net.apply(state.arrays["classifier"], x), axis=-1)


def _csd_method(context: str, towers: str) -> Method:
  what = {"train": "C = X", "augment": "C = X and augmentations of X",
          "ood": "C = X and unlabeled evaluation-distribution inputs"}[context]
  return Method(_csd_fit, _csd_score, _classifier_predict, csd_default_config(context, towers),
                uses_context=context == "ood",
                description=f"CSD ({towers} towers), {what}; accuracy from a separately trained "
                            f"classifier of the same backbone and budget")


# ----------------------------------------------------------------------------------------------
# The registry.
# ----------------------------------------------------------------------------------------------

_CSD_NAMES = {"csd": "train", "csd_aug": "augment", "csd_ood": "ood"}


def _build_registry() -> dict[str, Method]:
  reg = {}
  for name, context in _CSD_NAMES.items():
    reg[name] = _csd_method(context, DEFAULT_TOWERS)
  reg["ens3"] = Method(ensembles.fit, ensembles.score, ensembles.predict,
                       ensembles.default_config(3), description="deep ensemble of 3")
  reg["ens15"] = Method(ensembles.fit, ensembles.score, ensembles.predict,
                        ensembles.default_config(15), description="deep ensemble of 15")
  reg["mc_dropout"] = Method(mc_dropout.fit, mc_dropout.score, mc_dropout.predict,
                             mc_dropout.default_config(), description="MC dropout")
  reg["laplace"] = Method(laplace.fit, laplace.score, laplace.predict, laplace.default_config(),
                          description="last-layer Laplace, full GGN (laplax)")
  reg["rnd"] = Method(rnd.fit, rnd.score, rnd.predict, rnd.default_config(),
                      description="random network distillation")
  for name, context in _CSD_NAMES.items():
    for towers in ("matched", "free"):
      reg[f"{name}_{towers}"] = _csd_method(context, towers)
  return reg


METHODS: dict[str, Method] = _build_registry()

# The paper's table rows, in order; the benchmark also runs ALTERNATE_TOWERS for the comparison.
MAIN_METHODS = ("csd", "csd_aug", "csd_ood", "ens3", "ens15", "mc_dropout", "laplace", "rnd")


def alternate_towers() -> tuple[str, ...]:
  """The CSD variants in the tower form that is not the default (for the comparison)."""
  other = "free" if DEFAULT_TOWERS == "matched" else "matched"
  return tuple(f"{name}_{other}" for name in _CSD_NAMES)


def get(name: str) -> Method:
  if name not in METHODS:
    raise ValueError(f"unknown method {name!r}; valid: {', '.join(METHODS)}")
  return METHODS[name]


def small_budget(name: str, num_steps: int, batch_size: int = 64) -> dict:
  """Overrides that shrink method ``name`` to a tiny budget (tests, ``--quick`` runs): every
  network (classifier, members, CSD's g, RND) trains ``num_steps`` steps of ``batch_size``;
  MC dropout takes 4 passes and Laplace 16 samples."""
  over: dict = {"train": {"num_steps": num_steps, "batch_size": batch_size}}
  if name.startswith("csd"):
    over["num_steps"] = num_steps
  if name == "mc_dropout":
    over["num_passes"] = 4
  if name == "laplace":
    over["num_samples"] = 16
  return over


def config_for(name: str, overrides: Mapping | None = None) -> train.Config:
  """The method's default config updated by ``overrides`` (nested dicts merge)."""
  return train.merge(get(name).default_config, overrides)
