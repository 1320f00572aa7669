"""Every uncertainty method behind one interface, and the registry the benchmarks loop over.

A ``Method`` is four things:

* ``fit(key, train: data.Dataset, config, context=None) -> MethodState``;
* ``score(state, x (B, 28, 28, 1)) -> (B,)`` uncertainty, higher = more out-of-distribution;
* ``predict(state, x) -> (B, 10)`` class probabilities (the accuracy column);
* ``default_config``: an ``ml_collections.FrozenConfigDict``; ``fit`` takes it, or
  ``config_for(name, overrides)``, or any ConfigDict of the same fields.

``score`` and ``predict`` are pure and jit-able: ``jax.jit(method.score)(state, x)``. ``fit`` is a
Python loop over jitted steps. ``context`` is read only by methods with ``uses_context`` (CSD-OOD:
unlabeled inputs of the evaluation distributions, which the caller keeps disjoint from the
evaluated inputs).

Methods (all share the backbone ``base.BACKBONE`` and the per-network budget ``base.TRAIN``):

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
import json
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import optax

from uncertainty_kit import augment as augment_lib
from csd_jax import csd
from csd_jax import fitting
from csd_jax import models
from csd_jax import posterior
from uncertainty_kit import train
from uncertainty_kit import base
from uncertainty_kit.baselines import ensembles
from uncertainty_kit.baselines import laplace
from uncertainty_kit.baselines import mc_dropout
from uncertainty_kit.baselines import rnd
from uncertainty_kit.baselines import sgld
from uncertainty_kit.base import MethodState

Array = jax.Array

# The paper's deep form; the benchmark also runs the other (ood.json "tower_comparison").
DEFAULT_TOWERS = "deep"


class Method(NamedTuple):
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


# ----------------------------------------------------------------------------------------------
# CSD.
# ----------------------------------------------------------------------------------------------

CSD_CONTEXTS = ("train", "augment", "ood")
TOWER_FORMS = ("deep", "matched")


def csd_default_config(context: str = "train", towers: str = DEFAULT_TOWERS) -> dict:
  """CSD's defaults. ``num_steps``/``batch_size`` are g's own budget (Bx × Bc label blocks).

  ``towers="deep"``: the paper's estimator (``csd.CSD.deep``): a fixed random prior net
  ``prior_net`` (the backbone's convolutions, then ``prior_net.widths``) gives the cosine
  labels; φ and ψ are ``tower`` CNNs on raw inputs (separate, or one torso with two heads),
  unit-normalised, trained by Adam with a linear anneal on the diagonal-weighted pair loss.
  ``towers="matched"``: the exact last-layer NTK-GP of the trained classifier, solved by
  preconditioned gradient descent (the validation reference).
  """
  if context not in CSD_CONTEXTS:
    raise ValueError(f"context must be one of {CSD_CONTEXTS}, got {context!r}")
  if towers not in TOWER_FORMS:
    raise ValueError(f"towers must be one of {TOWER_FORMS}, got {towers!r}")
  config = {
      **base.common_config(),
      "context": context,
      "towers": towers,
      "score": "relative_variance",  # or "variance" (module docstring)
      "augment": "paper",
      "augment_strength": 1.0,
  }
  if towers == "deep":
    return {
        **config,
        "prior": "init",
        # Both over the backbone's other settings (activation, init scales).
        "prior_net": {
            "convs": list(base.BACKBONE["convs"]),
            "widths": [256],
            "b_std": base.BACKBONE["b_std"],
        },
        "tower": {
            "convs": list(base.BACKBONE["convs"]),
            "widths": [256, 256],
            "b_std": base.BACKBONE["b_std"],
            # Distance-preserving towers (SNGP, DDU): c bounds each hidden layer's spectral
            # norm, residual adds a layer's input where shapes agree (``models.CNNSpec``).
            "spectral_norm": None,
            "residual": False,
        },
        "embed_dim": csd.DEEP_DEFAULTS["embed_dim"],
        # x̃ = clip((x − μ)/σ, ±input_clip) with training-set statistics before every net (the
        # prior's labels included): "pixel", "global" or "none" (``csd.CSD.input_norm``).
        "normalize_inputs": "none",
        "input_clip": 5.0,
        "shared_torso": False,
        "normalize": True,
        "loss_weighting": "diagonal",
        "lr": csd.DEEP_DEFAULTS["lr"],
        "adam_eps": csd.DEEP_DEFAULTS["adam_eps"],
        "anneal": csd.DEEP_DEFAULTS["anneal"],
        # ``csd.deep_form``'s defaults, tuned on the tuning split (docs/results.md).
        "num_steps": csd.DEEP_DEFAULTS["num_steps"],
        "batch_size": csd.DEEP_DEFAULTS["batch_size"],
        "context_batch_size": csd.DEEP_DEFAULTS["batch_size"],
        # CSD-Aug: each context replaced by its augmentation with p = 0.25 (the paper's p);
        # CSD-OOD: by an unlabeled context row with p = 0.5.
        "extra_fraction": 0.5 if context == "ood" else 0.25,
        # paper_augment's transforms; the full list generates rotated / jittered images, which
        # are evaluated OOD sets (``csd_aug_no_overlap`` leaves those out).
        "augment_include": list(augment_lib.PAPER_AUGMENTATIONS),
    }
  return {
      **config,
      "augment": "random",
      # The trained classifier's features: on this benchmark the random-init kernel ranks the
      # resized sklearn digits as less novel than held-out MNIST (``benchmarks.kernel_ceiling``).
      "prior": "trained",
      # ε of ``preconditioner.context_preconditioner`` relative to tr Σ_C (None = auto: 1e-5 for the
      # trained prior, 1e-3 for the random-init one, whose features are ill-conditioned); a
      # floor that ``preconditioner.stable_jitter`` raises until no context row has leverage > 2 Bc.
      "precondition_jitter": None,
      "matched_lr": 0.5,
      "matched_momentum": 0.9,
      "matched_clip": 0.0,
      # Early stopping is the ridge of the NTK-GP the fit converges to (docs/results.md).
      "num_steps": 3000,
      "batch_size": 128,
      "context_batch_size": 1024,  # cheap on cached features; tames high-leverage contexts
      "extra_fraction": 0.5,
      "augment_pool": 2,  # CSD-Aug: augmented copies per training image (0 = on the fly)
  }


def _deep_model(config) -> csd.CSD:
  backbone = dict(config["backbone"])
  prior = train.spec_from_config(
      {**backbone, **dict(config["prior_net"])}, out_dim=base.NUM_CLASSES
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
  prior = train.spec_from_config(config["backbone"], out_dim=base.NUM_CLASSES)
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
def _csd_model(form: str, fields_json: str) -> csd.CSD:
  config = json.loads(fields_json)
  return _deep_model(config) if form == "deep" else _matched_model(config)


def csd_model(config) -> csd.CSD:
  """The ``csd.CSD`` of a CSD method config. Equal fields give the identical object: a model is
  a jit static argument and its optax transform compares by identity, so rebuilding it would
  recompile every step."""
  form = config["towers"]
  if form not in TOWER_FORMS:
    raise ValueError(f"towers must be one of {TOWER_FORMS}, got {form!r}")
  fields = {
      k: base.to_dict(config[k]) if hasattr(config[k], "keys") else config[k]
      for k in _MODEL_FIELDS[form]
  }
  return _csd_model(form, json.dumps(fields, sort_keys=True, default=list))


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
  if config["context"] not in CSD_CONTEXTS:
    raise ValueError(f"context must be one of {CSD_CONTEXTS}, got {config['context']!r}")
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
  config = base.freeze(config)
  check_csd_config(config)
  if config["context"] == "ood" and context is None:
    raise ValueError("CSD-OOD needs context: unlabeled inputs of the evaluation distributions")
  k_prior, k_fit = jax.random.split(key)
  spec = base.classifier_spec(config)
  classifier, _ = train.cached_classifier(
      base.classifier_key(key),
      spec,
      data.images,
      data.labels,
      run=run.sub("classifier"),
      **base.train_kwargs(config),
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
  net = models.module(base.classifier_spec(state.config))
  return jax.nn.softmax(net.apply(state.arrays["classifier"], x), axis=-1)


def _csd_method(context: str, towers: str, **overrides) -> Method:
  what = {
      "train": "C = X",
      "augment": "C = X and augmentations of X",
      "ood": "C = X and unlabeled evaluation-distribution inputs",
  }[context]
  config = base.freeze({**csd_default_config(context, towers), **overrides})
  return Method(
      _csd_fit,
      _csd_score,
      _classifier_predict,
      config,
      uses_context=context == "ood",
      output_variance_scores=CSD_SCORES,
      description=f"CSD ({towers} towers), {what}; accuracy from a separately trained "
      f"classifier of the same backbone and budget",
  )


# ----------------------------------------------------------------------------------------------
# The closed form CSD estimates (a reference row, not a contender).
# ----------------------------------------------------------------------------------------------


def exact_default_config() -> dict:
  """``ridge``: λ relative to tr Σ_X (Σ_X = ΦᵀΦ/N), i.e. ``diag_reg`` = ridge · N in
  ``posterior``'s units. 1e-6 is about the ridge CSD's 3000-step matched fit converges to
  (docs/results.md)."""
  return {**base.common_config(), "prior": "trained", "ridge": 1e-6, "score": "relative_variance"}


def _exact_fit(
    key, data, config, context=None, run: train.RunOptions = train.DEFAULT_RUN
) -> MethodState:
  del context
  config = base.freeze(config)
  spec = base.classifier_spec(config)
  classifier, _ = train.cached_classifier(
      base.classifier_key(key),
      spec,
      data.images,
      data.labels,
      run=run.sub("classifier"),
      **base.train_kwargs(config),
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
  phi = models.last_layer_features(base.classifier_spec(state.config), state.arrays["prior"], x)
  v = posterior.ntkgp_variance_from_features(
      phi_train, phi, float(state.config["ridge"]) * phi_train.shape[0]
  )
  if state.config["score"] == "variance":
    return v
  return v / jnp.maximum(jnp.sum(phi * phi, axis=-1), 1e-12)


# ----------------------------------------------------------------------------------------------
# The registry.
# ----------------------------------------------------------------------------------------------

_CSD_NAMES = {"csd": "train", "csd_aug": "augment", "csd_ood": "ood"}
# paper_augment's transforms that generate evaluated OOD sets (rot90 / rot_random; the
# brightness and contrast of the perturbed-ID set).
OVERLAPPING_AUGMENTATIONS = ("rotation", "brightness_contrast")


def _build_registry() -> dict[str, Method]:
  reg = {}
  for name, context in _CSD_NAMES.items():
    reg[name] = _csd_method(context, DEFAULT_TOWERS)
  logits = base.LOGIT_KINDS
  reg["ens3"] = Method(
      ensembles.fit,
      ensembles.score,
      ensembles.predict,
      base.freeze(ensembles.default_config(3)),
      description="deep ensemble of 3",
      output_variance_scores=logits,
  )
  reg["ens15"] = Method(
      ensembles.fit,
      ensembles.score,
      ensembles.predict,
      base.freeze(ensembles.default_config(15)),
      description="deep ensemble of 15",
      output_variance_scores=logits,
  )
  reg["mc_dropout"] = Method(
      mc_dropout.fit,
      mc_dropout.score,
      mc_dropout.predict,
      base.freeze(mc_dropout.default_config()),
      description="MC dropout",
      output_variance_scores=logits,
  )
  reg["laplace"] = Method(
      laplace.fit,
      laplace.score,
      laplace.predict,
      base.freeze(laplace.default_config()),
      description="last-layer Laplace, full GGN (laplax)",
      output_variance_scores=logits,
  )
  reg["bnn_mcmc"] = Method(
      sgld.fit,
      sgld.score,
      sgld.predict,
      base.freeze(sgld.default_config()),
      description="Bayesian NN, all parameters sampled by SGLD (blackjax) "
      "from the shared classifier",
      output_variance_scores=logits,
  )
  reg["rnd"] = Method(
      rnd.fit,
      rnd.score,
      rnd.predict,
      base.freeze(rnd.default_config()),
      description="random network distillation (the paper's shape: target = "
      "conv torso + one 256 layer, predictor = torso + 2 × 256, "
      "256-d outputs, normalised inputs)",
  )
  reg["ntkgp_exact"] = Method(
      _exact_fit,
      _exact_score,
      _classifier_predict,
      base.freeze(exact_default_config()),
      description="closed-form NTK-GP variance of CSD's label kernel "
      "(what CSD estimates; primal form, O(Nd²))",
      output_variance_scores=CSD_SCORES,
  )
  for name, context in _CSD_NAMES.items():
    for towers in TOWER_FORMS:
      reg[f"{name}_{towers}"] = _csd_method(context, towers)
  reg["csd_aug_no_overlap"] = _csd_method(
      "augment",
      "deep",
      augment_include=[
          a for a in augment_lib.PAPER_AUGMENTATIONS if a not in OVERLAPPING_AUGMENTATIONS
      ],
  )
  return reg


METHODS: dict[str, Method] = _build_registry()

# The paper's table rows, in order; the benchmark also runs ALTERNATE_TOWERS for the comparison.
MAIN_METHODS = (
    "csd",
    "csd_aug",
    "csd_aug_no_overlap",
    "csd_ood",
    "ens3",
    "ens15",
    "mc_dropout",
    "laplace",
    "bnn_mcmc",
    "rnd",
    "ntkgp_exact",
)


def alternate_towers() -> tuple[str, ...]:
  """The CSD variants in the tower form that is not the default (for the comparison)."""
  other = "deep" if DEFAULT_TOWERS == "matched" else "matched"
  return tuple(f"{name}_{other}" for name in _CSD_NAMES)


def get(name: str) -> Method:
  if name not in METHODS:
    raise ValueError(f"unknown method {name!r}; valid: {', '.join(METHODS)}")
  return METHODS[name]


def small_budget(name: str, num_steps: int, batch_size: int = 64) -> dict:
  """Overrides that shrink method ``name`` to a tiny budget (tests, the ``:quick`` config profiles): every
  network (classifier, members, CSD's g, RND) trains ``num_steps`` steps of ``batch_size``;
  MC dropout takes 4 passes and Laplace 16 samples."""
  over: dict = {"train": {"num_steps": num_steps, "batch_size": batch_size}}
  if name.startswith("csd"):
    over["num_steps"] = num_steps
    if get(name).default_config["towers"] == "deep":
      over.update(batch_size=batch_size, context_batch_size=batch_size)
  if name == "mc_dropout":
    over["num_passes"] = 4
  if name == "laplace":
    over["num_samples"] = 16
  if name == "bnn_mcmc":
    over.update(
        num_burnin=num_steps // 2, thin=max(1, num_steps // 8), num_samples=4, batch_size=batch_size
    )
  return over


def config_for(name: str, overrides=None) -> ml_collections.FrozenConfigDict:
  """The method's default config updated by ``overrides`` (a dict or ConfigDict; nested dicts
  merge); an unknown key raises ``ValueError``. Values are not type-checked here: each ``fit``
  checks what it reads (e.g. ``rnd.check_config``)."""
  config = ml_collections.ConfigDict(base.to_dict(get(name).default_config), type_safe=False)
  config.lock()
  try:
    config.update(base.to_dict(overrides or {}))
  except KeyError as e:
    raise ValueError(f"{name}: unknown config key: {e}") from None
  return base.freeze(config)
