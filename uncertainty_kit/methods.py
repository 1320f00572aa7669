"""Every uncertainty method behind one interface, and the registry the benchmarks loop over.

A ``Method`` (``uncertainty_kit.interface``) is four things:

* ``fit(key, train: data.Dataset, config, context=None) -> MethodState``;
* ``score(state, x (B, 28, 28, 1)) -> (B,)`` uncertainty, higher = more out-of-distribution;
* ``predict(state, x) -> (B, 10)`` class probabilities (the accuracy column);
* ``default_config``: the frozen form (``ml_collections.FrozenConfigDict``) of the method's
  plain defaults in ``uncertainty_kit.defaults``. ``fit`` takes a frozen config as it is: this
  one, ``config_for(name, overrides)``, or a binary's ``cli.freeze`` of its ``--config``.

``score`` and ``predict`` are pure and jit-able: ``jax.jit(method.score)(state, x)``. ``fit`` is a
Python loop over jitted steps. ``context`` is read only by methods with ``uses_context`` (CSD-OOD:
unlabeled inputs of the evaluation distributions, which the caller keeps disjoint from the
evaluated inputs).

Methods (all share the backbone ``defaults.BACKBONE`` and the per-network budget
``defaults.TRAIN``):

* ``csd``: Contextual Similarity Distillation (``csd_jax.csd``), context C = X, in the paper's
  deep form (``towers="deep"``, ``csd.CSD.deep``): a fixed random prior CNN gives cosine labels
  of its last-layer features; φ and ψ are CNNs on raw inputs, unit-normalised, fitted on the
  diagonal-weighted pair loss. Score (``score``): ``"relative_variance"``, 1 − cos(φ(x), ψ(x)),
  or ``"variance"``, ‖ϕ̃(x)‖²(1 − cos). CSD has no classifier: ``predict`` uses a plain
  classifier of the same backbone trained with the same budget (the one RND and Laplace's MAP
  use, trained once).
* ``csd_aug``: each context x_i replaced, with probability ``extra_fraction`` (0.25), by its
  augmentation (``augment="paper"``: ``augment.paper_augment``); ``csd_aug_no_overlap`` leaves
  out the transforms that generate evaluated OOD sets (rotation; brightness and contrast).
* ``csd_ood``: each context replaced with probability ``extra_fraction`` by a row of
  ``context`` (unlabeled inputs of the evaluation distributions, disjoint from evaluated ones).
* ``towers="matched"`` (``<name>_matched``): the exact last-layer NTK-GP of the *trained*
  classifier, solved by gradient descent (φ = its frozen last-layer features, ψ linear, the
  context side preconditioned by ``preconditioner.context_preconditioner``). It converges to the closed
  form ``ntkgp_exact`` computes directly (and more cheaply); it is the validation reference,
  and its contexts cannot change the converged estimate.
* ``ntkgp_exact``: not a contender but CSD's target: the closed-form NTK-GP variance of the same
  label kernel (``posterior.ntkgp_variance_from_features``), to tell CSD's fit error from the
  kernel's own limits.
* ``ens3``, ``ens15``: deep ensembles; ``mc_dropout``; ``laplace`` (last-layer, full GGN,
  laplax); ``bnn_mcmc`` (SGLD over all parameters, blackjax); ``rnd``: see ``uncertainty_kit.baselines``.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Mapping

import jax
import jax.numpy as jnp
import ml_collections
import optax

from cmdline import cli
from csd_jax import csd
from csd_jax import fitting
from csd_jax import models
from csd_jax import posterior
from uncertainty_kit import augment as augment_lib
from uncertainty_kit import defaults
from uncertainty_kit import keys
from uncertainty_kit import scores
from uncertainty_kit import train
from uncertainty_kit.baselines import ensembles
from uncertainty_kit.baselines import laplace
from uncertainty_kit.baselines import mc_dropout
from uncertainty_kit.baselines import rnd
from uncertainty_kit.baselines import sgld
from uncertainty_kit.interface import Method
from uncertainty_kit.interface import MethodState

Array = jax.Array

# ----------------------------------------------------------------------------------------------
# CSD.
# ----------------------------------------------------------------------------------------------


def _deep_model(config) -> csd.CSD:
  backbone = dict(config["backbone"])
  prior = train.spec_from_config(
      {**backbone, **dict(config["prior_net"])}, out_dim=defaults.NUM_CLASSES
  )
  tower = train.spec_from_config({**backbone, **dict(config["tower"])})
  model = csd.deep_form(
      prior,
      tower,
      num_steps=int(config["num_steps"]),
      embed_dim=int(config["embed_dim"]),
      lr=float(config["lr"]),
      adam_eps=float(config["adam_eps"]),
      anneal=bool(config["anneal"]),
      shared_torso=bool(config["shared_torso"]),
      input_norm=str(config["normalize_inputs"]),
      input_clip=None if config["normalize_inputs"] == "none" else float(config["input_clip"]),
  )
  # Ablations of the paper's form (unnormalised towers, the block loss) keep its other settings.
  return dataclasses.replace(
      model, normalize=bool(config["normalize"]), loss_weighting=str(config["loss_weighting"])
  )


def _matched_model(config) -> csd.CSD:
  prior = train.spec_from_config(config["backbone"], out_dim=defaults.NUM_CLASSES)
  jitter = precondition_jitter(config)
  if jitter <= 0:
    return csd.CSD(prior=prior)
  sgd = optax.sgd(
      float(config["matched_lr"]), momentum=float(config["matched_momentum"]), nesterov=True
  )
  if float(config["matched_clip"]) > 0:
    sgd = optax.chain(optax.clip_by_global_norm(float(config["matched_clip"])), sgd)
  return csd.CSD(prior=prior, precondition_jitter=jitter, optimizer=sgd)


# The config fields each tower form's ``csd.CSD`` is built from (the rest: ``csd_fit_kwargs``,
# the context choice and the score).
_MODEL_FIELDS = {
    "deep": (
        "backbone",
        "prior_net",
        "tower",
        "embed_dim",
        "shared_torso",
        "normalize",
        "loss_weighting",
        "lr",
        "adam_eps",
        "anneal",
        "num_steps",
        "normalize_inputs",
        "input_clip",
    ),
    "matched": (
        "backbone",
        "prior",
        "precondition_jitter",
        "matched_lr",
        "matched_momentum",
        "matched_clip",
    ),
}


@functools.lru_cache(maxsize=64)
def _csd_model(form: str, fields: ml_collections.FrozenConfigDict) -> csd.CSD:
  return _deep_model(fields) if form == "deep" else _matched_model(fields)


def csd_model(config: ml_collections.FrozenConfigDict) -> csd.CSD:
  """The ``csd.CSD`` of a CSD method config. Configs whose model fields (``_MODEL_FIELDS``) are
  equal give the identical object, whatever their other fields (context, score): a model is a
  jit static argument and its optax transform compares by identity, so rebuilding it would
  recompile every step."""
  form = config["towers"]
  if form not in defaults.TOWER_FORMS:
    raise ValueError(f"towers must be one of {defaults.TOWER_FORMS}, got {form!r}")
  fields = ml_collections.FrozenConfigDict({k: config[k] for k in _MODEL_FIELDS[form]})
  return _csd_model(form, fields)


def precondition_jitter(config) -> float:
  """The config's ε (None = auto: 1e-5 for the trained prior, 1e-3 for the random-init one)."""
  jitter = config["precondition_jitter"]
  if jitter is None:
    return 1e-5 if config["prior"] == "trained" else 1e-3
  return float(jitter)


AUGMENTS = ("paper", "random")


def augment_fn(config):
  """CSD-Aug's augmentation: ``augment.paper_augment`` with ``augment_include``, or the
  project's ``augment.random_augment`` at ``augment_strength``."""
  if config["augment"] not in AUGMENTS:
    raise ValueError(f"augment must be one of {AUGMENTS}, got {config['augment']!r}")
  if config["augment"] == "paper":
    return _paper_augment(tuple(config["augment_include"]))
  return _random_augment(float(config["augment_strength"]))


@functools.lru_cache(maxsize=8)
def _paper_augment(include: tuple[str, ...]):
  return functools.partial(augment_lib.paper_augment, include=include)


@functools.lru_cache(maxsize=8)
def _random_augment(strength: float):
  if strength == 1.0:
    return augment_lib.default_augmentation
  return functools.partial(augment_lib.random_augment, strength=strength)


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
      out.append(aug(jax.random.fold_in(k, i), images[i : i + chunk]))
  return jnp.concatenate(out)


PRIORS = ("init", "trained")


def check_csd_config(config) -> None:
  """A ``ValueError`` naming the first bad field of a CSD config, before any work."""
  for name in ("num_steps", "batch_size", "context_batch_size"):
    v = config[name]
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
      raise ValueError(f"{name} must be a positive integer, got {v!r}")
  if not 0.0 <= float(config["extra_fraction"]) <= 1.0:
    raise ValueError(f"extra_fraction must be in [0, 1], got {config['extra_fraction']!r}")
  if config["prior"] not in PRIORS or (config["towers"] == "deep" and config["prior"] != "init"):
    raise ValueError(
        f"prior must be 'init' or (matched towers) 'trained', got " f"{config['prior']!r}"
    )
  if config["score"] not in CSD_SCORES:
    raise ValueError(f"CSD score must be one of {CSD_SCORES}, got {config['score']!r}")
  if config["context"] not in defaults.CSD_CONTEXTS:
    raise ValueError(f"context must be one of {defaults.CSD_CONTEXTS}, got {config['context']!r}")
  csd_model(config)  # the model's own checks (towers, norms, optimizer settings)


def csd_fit_kwargs(config) -> dict:
  """``csd_jax.fit``'s budget arguments of a CSD config (the contexts are the fit's own)."""
  return dict(
      num_steps=int(config["num_steps"]),
      batch_size=int(config["batch_size"]),
      context_batch_size=int(config["context_batch_size"]),
      extra_fraction=float(config["extra_fraction"]),
  )


def _csd_fit(
    key, data, config, context=None, run: train.RunOptions = train.DEFAULT_RUN
) -> MethodState:
  check_csd_config(config)
  if config["context"] == "ood" and context is None:
    raise ValueError("CSD-OOD needs context: unlabeled inputs of the evaluation distributions")
  k_prior, k_fit = jax.random.split(key)
  spec = train.classifier_spec(config)
  classifier, _ = train.cached_classifier(
      keys.classifier_key(key),
      spec,
      data.images,
      data.labels,
      run=run.sub("classifier"),
      **train.train_kwargs(config),
  )
  model = csd_model(config)
  x_train = jnp.asarray(data.images)
  prior_params = {"init": None, "trained": classifier}[config["prior"]]
  state = csd.init(model, k_prior, x_train, prior_params=prior_params)
  ctx, aug = None, None
  if config["context"] == "ood":
    ctx = jnp.asarray(context)
  elif config["context"] == "augment":
    aug = augment_fn(config)
    if config["towers"] == "matched" and int(config["augment_pool"]) > 0:  # a fixed pool
      ctx, aug = (
          augmentation_pool(jax.random.fold_in(key, 2), x_train, aug, int(config["augment_pool"])),
          None,
      )
  fit_kw = csd_fit_kwargs(config)
  state, _ = fitting.fit(
      model,
      state,
      k_fit,
      x_train,
      context=ctx,
      augment=aug,
      log_every=fit_kw["num_steps"],
      mesh=run.mesh,
      checkpoint_dir=run.sub("csd").checkpoint_dir,
      checkpoint_every=run.checkpoint_every,
      verbose=False,
      **fit_kw,
  )
  params = dict(state.params)
  if not params.get("feature"):
    params.pop("feature", None)  # empty for matched towers; orbax does not keep empty dicts
  arrays = {
      "towers": params,
      "prior": state.prior_params,
      "label_scale": state.label_scale,
      "classifier": classifier,
  }
  if state.input_mean is not None:
    arrays.update(input_mean=state.input_mean, input_std=state.input_std)
  return MethodState(arrays=arrays, config=config)


def csd_state(state: MethodState) -> csd.CSDState:
  """The ``csd.CSDState`` (without optimizer state) inside a CSD method's state."""
  params = dict(state.arrays["towers"])
  params.setdefault("feature", {})
  return csd.CSDState(
      params=params,
      opt_state=None,
      prior_params=state.arrays["prior"],
      label_scale=state.arrays["label_scale"],
      step=jnp.zeros((), jnp.int32),
      input_mean=state.arrays.get("input_mean"),
      input_std=state.arrays.get("input_std"),
  )


CSD_SCORES = ("variance", "relative_variance")


def _csd_score(state: MethodState, x) -> Array:
  if state.config["score"] not in CSD_SCORES:
    raise ValueError(f"CSD score must be one of {CSD_SCORES}, got {state.config['score']!r}")
  return csd.variance(
      csd_model(state.config),
      csd_state(state),
      x,
      relative=state.config["score"] == "relative_variance",
  )[0]


def _classifier_predict(state: MethodState, x) -> Array:
  net = models.module(train.classifier_spec(state.config))
  return jax.nn.softmax(net.apply(state.arrays["classifier"], x), axis=-1)


def _csd_method(config: ml_collections.FrozenConfigDict) -> Method:
  what = {
      "train": "C = X",
      "augment": "C = X and augmentations of X",
      "ood": "C = X and unlabeled evaluation-distribution inputs",
  }[config["context"]]
  return Method(
      _csd_fit,
      _csd_score,
      _classifier_predict,
      config,
      uses_context=config["context"] == "ood",
      output_variance_scores=CSD_SCORES,
      description=f"CSD ({config['towers']} towers), {what}; accuracy from a separately trained "
      f"classifier of the same backbone and budget",
  )


# ----------------------------------------------------------------------------------------------
# The closed form CSD estimates (a reference row, not a contender).
# ----------------------------------------------------------------------------------------------


def _exact_fit(
    key, data, config, context=None, run: train.RunOptions = train.DEFAULT_RUN
) -> MethodState:
  del context
  spec = train.classifier_spec(config)
  classifier, _ = train.cached_classifier(
      keys.classifier_key(key),
      spec,
      data.images,
      data.labels,
      run=run.sub("classifier"),
      **train.train_kwargs(config),
  )
  if config["prior"] == "trained":
    prior = classifier
  else:  # the random init CSD's fit draws (csd.init with the same key)
    prior = models.module(spec).init(
        jax.random.split(jax.random.split(key)[0], 3)[0], jnp.asarray(data.images[:1])
    )
  x = jnp.asarray(data.images)
  phi = models.batched_last_layer_features(spec, prior, x)
  return MethodState(
      arrays={"phi_train": phi, "prior": prior, "classifier": classifier}, config=config
  )


def _exact_score(state: MethodState, x) -> Array:
  if state.config["score"] not in CSD_SCORES:
    raise ValueError(f"score must be one of {CSD_SCORES}, got {state.config['score']!r}")
  phi_train = state.arrays["phi_train"]
  phi = models.last_layer_features(train.classifier_spec(state.config), state.arrays["prior"], x)
  v = posterior.ntkgp_variance_from_features(
      phi_train, phi, float(state.config["ridge"]) * phi_train.shape[0]
  )
  if state.config["score"] == "variance":
    return v
  return v / jnp.maximum(jnp.sum(phi * phi, axis=-1), 1e-12)


# ----------------------------------------------------------------------------------------------
# The registry.
# ----------------------------------------------------------------------------------------------


def _build_registry() -> dict[str, Method]:
  """Every method by name, each with its frozen default config (``defaults.methods``)."""
  configs = {name: cli.freeze(config) for name, config in defaults.methods().items()}
  logits = scores.LOGIT_KINDS
  baselines = {
      "ens3": (ensembles, "deep ensemble of 3", logits),
      "ens15": (ensembles, "deep ensemble of 15", logits),
      "mc_dropout": (mc_dropout, "MC dropout", logits),
      "laplace": (laplace, "last-layer Laplace, full GGN (laplax)", logits),
      "bnn_mcmc": (
          sgld,
          "Bayesian NN, all parameters sampled by SGLD (blackjax) from the shared classifier",
          logits,
      ),
      "rnd": (
          rnd,
          "random network distillation (the paper's shape: target = conv torso + one 256 "
          "layer, predictor = torso + 2 × 256, 256-d outputs, normalised inputs)",
          None,
      ),
  }
  reg = {}
  for name, config in configs.items():
    if name == "ntkgp_exact":
      reg[name] = Method(
          _exact_fit,
          _exact_score,
          _classifier_predict,
          config,
          description="closed-form NTK-GP variance of CSD's label kernel "
          "(what CSD estimates; primal form, O(Nd²))",
          output_variance_scores=CSD_SCORES,
      )
    elif name in baselines:
      module, description, variance_scores = baselines[name]
      reg[name] = Method(
          module.fit,
          module.score,
          module.predict,
          config,
          description=description,
          output_variance_scores=variance_scores,
      )
    else:
      reg[name] = _csd_method(config)
  return reg


METHODS: dict[str, Method] = _build_registry()


def get(name: str) -> Method:
  if name not in METHODS:
    raise ValueError(f"unknown method {name!r}; valid: {', '.join(METHODS)}")
  return METHODS[name]


def _merged(base: Mapping, overrides: Mapping, path: str) -> dict:
  out = dict(base)
  for k, v in overrides.items():
    if k not in base:
      raise ValueError(f"{path}: unknown config key: {k!r}")
    if isinstance(base[k], Mapping) and isinstance(v, Mapping):
      out[k] = _merged(base[k], v, f"{path}.{k}")
    else:
      out[k] = v
  return out


def config_for(name: str, overrides=None) -> ml_collections.FrozenConfigDict:
  """Method ``name``'s frozen config: its defaults (``defaults.methods``) updated by
  ``overrides`` (a dict or ConfigDict; nested dicts merge), converted once. An unknown key
  raises ``ValueError``. Values are not type-checked here: each ``fit`` checks what it reads
  (e.g. ``rnd.check_config``)."""
  get(name)
  config = defaults.methods()[name]
  return cli.freeze(_merged(config, cli.to_dict(overrides or {}), name))
