"""Contextual Similarity Distillation: the variance of an infinite ensemble from one model.

Notation (docs/design.md §1): training inputs X, context set C, prior net f at its random
initialisation θ₀, label kernel k (the last-layer NTK Θ_L of f, or its full empirical NTK
Θ̂). CSD trains ``g(x, c) = φ(x)ᵀψ(c)`` by squared loss on labels ``k(x_i, c_j)``,
x_i ∈ X, c_j ∈ C, and estimates the NTK-GP variance as

    V(x) ≈ k(x, x) − g(x, x).                                           (CSD)

Towers:

* ``feature_net=None`` (default): φ(x) = ϕ̃(x), the prior's own last-layer features,
  frozen. g is then linear in its parameters with x-side kernel exactly Θ_L, so gradient
  descent from ψ ≡ 0 converges to g(x, c) = ϕ̃(x)ᵀ P_X P_C ϕ̃(c) (P_S: projection onto the
  span of S's features) and with C ⊇ X to V(x) = Θ_L(x,x) − Θ_L(x,X)Θ_L(X,X)⁺Θ_L(X,x),
  the closed form. Gradient descent (not Adam, whose coordinate-wise scaling leaves the
  span) keeps this exactness; early stopping acts as a ridge regulariser.
* ``feature_net=spec``: a free net φ on the raw input (the paper's deep recipe). Its
  training dynamics follow φ's own (evolving) kernel, not the label kernel, so the
  estimate is an approximation; ``validation/contextual.py`` measures by how much.
* ``context_net=None``: ψ(c) = W ϕ̃(c) (linear, W initialised to 0); ``context_net=spec``:
  a free net on the raw context with its head initialised to 0. Either way g₀ ≡ 0,
  the small-output init the single-query theorem needs.

The deep form (``CSD.deep``; the paper's implementation, Zanger's thesis App. B): free towers
with ``normalize=True`` and ``loss_weighting="diagonal"``. Then ϕ̃, φ and ψ are each scaled to
unit length, so g(x, c) = cos(φ(x), ψ(c)) is regressed onto cos(ϕ̃(x), ϕ̃(c)); the loss is the
mean squared error over the diagonal of the (B, B) pair block plus that over its off-diagonal
(``pair_loss``), contexts are paired with inputs (c_i = x_i, or its augmentation, or an
extra context row: ``sample_batch``), and V(x) = ‖ϕ̃(x)‖² (1 − cos(φ(x), ψ(x))), relative
form 1 − cos. Normalised towers start with g ≠ 0 (a zero head cannot be normalised).
``shared_torso=True`` computes φ and ψ as two linear heads on one torso.

Matched towers (both None) train on the prior's features only, so ``fitting.fit`` computes ϕ̂ of X and
of the context set once and runs its steps on those rows (unless contexts are augmented on the
fly); ``precondition_jitter`` > 0 adds ``preconditioner.context_preconditioner``.

Labels are divided by ``label_scale`` = the mean of k(x, x) over the training data
(fixed at ``init``), so the regression targets are O(1) whatever the kernel's scale.

Every function is pure: params, optimizer state and PRNG keys go in and come out.
``train_step`` and ``variance`` are jitted; ``fitting.fit`` is the loop, data-parallel over a
``jax.sharding.Mesh`` when given one (batch axis sharded, params replicated).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, NamedTuple

import chex
import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from csd_jax import _nt_compat
from csd_jax import models
from csd_jax import preconditioner
from csd_jax.checks import check_array

Array = jax.Array
PyTree = Any
AugmentFn = Callable[[Array, Array], Array]  # (key, images) -> images

LABEL_KERNELS = ("last_layer", "ntk")
# Input standardisation the model applies before every net (stats fixed at ``init``): per
# pixel / feature, one scalar over the training set, or none.
INPUT_NORMS = ("none", "pixel", "global")
STD_FLOOR = 1e-2  # σ below this (constant pixels) is raised to it
# "block": the mean over all Bx × Bc pairs; "diagonal": mean over the pairs (x_i, c_i) plus
# mean over the pairs (x_i, c_j≠i), equal weight (``pair_loss``).
LOSS_WEIGHTINGS = ("block", "diagonal")


@dataclasses.dataclass(frozen=True)
class CSD:
  """Static definition of a CSD estimator (hashable: it is a jit static argument).

  Attributes:
    prior: spec of the prior net f; labels come from f at its random init. Or any
      ``flax.linen.Module`` whose output (B, n) is the prior features ϕ̃ (last-layer labels only).
    feature_net: spec of φ on raw inputs, or None for φ = ϕ̃ (module docstring). Or any
      ``flax.linen.Module`` (B, ...) -> (B, h), followed by a linear head to ``embed_dim``.
    context_net: spec (or flax module, as for ``feature_net``) of ψ on raw contexts, or None
      for ψ = W ϕ̃.
    embed_dim: output size of free towers; ignored (= dim ϕ̃) when feature_net is None.
    label_kernel: ``"last_layer"`` (Θ_L, default) or ``"ntk"`` (exact empirical NTK of f).
    optimizer: optax transformation; None picks ``default_optimizer``.
    precondition_jitter: matched towers only; ε > 0 chains ``preconditioner.context_preconditioner`` before
      the optimizer, with (Σ_C + ε tr(Σ_C) I)⁻¹ set by ``fitting.fit`` from the context distribution
      (``context_second_moment``); 0 = off.
    normalize: free towers, last-layer labels only: ϕ̃, φ, ψ scaled to unit length (g and the
      labels are cosine similarities; module docstring).
    loss_weighting: one of ``LOSS_WEIGHTINGS`` (``pair_loss``); ``"diagonal"`` needs Bx = Bc
      and contexts paired with the inputs.
    shared_torso: φ and ψ are two linear heads on one ``feature_net`` torso (``context_net``
      must be None or the same spec).
    input_norm: one of ``INPUT_NORMS``: x̃ = (x − μ)/σ with the training set's μ, σ (kept in
      ``CSDState``, set by ``init``) before every net, the prior's labels included.
    input_clip: with ``input_norm``, x̃ clipped to ±input_clip (None: not clipped).
  """

  prior: models.Spec
  feature_net: models.Spec | None = None
  context_net: models.Spec | None = None
  embed_dim: int = 128
  label_kernel: str = "last_layer"
  optimizer: optax.GradientTransformation | None = None
  precondition_jitter: float = 0.0
  normalize: bool = False
  loss_weighting: str = "block"
  shared_torso: bool = False
  input_norm: str = "none"
  input_clip: float | None = None

  def __post_init__(self):
    if self.label_kernel not in LABEL_KERNELS:
      raise ValueError(f"label_kernel must be one of {LABEL_KERNELS}, got {self.label_kernel!r}")
    if self.embed_dim < 1:
      raise ValueError(f"embed_dim must be positive, got {self.embed_dim}")
    if self.label_kernel == "ntk" and self.feature_net is None:
      raise ValueError(
          "label_kernel='ntk' needs a feature_net: the frozen last-layer "
          "features only represent the last-layer kernel"
      )
    if not self.precondition_jitter >= 0.0:
      raise ValueError(f"precondition_jitter must be >= 0, got {self.precondition_jitter}")
    if self.precondition_jitter > 0 and not self.matched:
      raise ValueError(
          "precondition_jitter > 0 needs matched towers (feature_net and "
          "context_net None): it preconditions the linear context map"
      )
    if self.loss_weighting not in LOSS_WEIGHTINGS:
      raise ValueError(
          f"loss_weighting must be one of {LOSS_WEIGHTINGS}, " f"got {self.loss_weighting!r}"
      )
    if self.normalize and (self.feature_net is None or self.label_kernel != "last_layer"):
      raise ValueError(
          "normalize=True needs a feature_net (free towers) and "
          "label_kernel='last_layer' (cosine labels of the prior's features)"
      )
    if self.shared_torso and (
        self.feature_net is None or self.context_net not in (None, self.feature_net)
    ):
      raise ValueError(
          "shared_torso=True needs a feature_net, and context_net None or equal "
          "to it (one torso, two heads)"
      )
    for name in ("prior", "feature_net", "context_net"):
      net = getattr(self, name)
      if net is not None:
        models.is_spec(net)  # a TypeError naming the type otherwise
    if not models.is_spec(self.prior) and self.label_kernel != "last_layer":
      raise ValueError(
          "a flax-module prior gives last-layer labels only (its output is ϕ̃): "
          "label_kernel='ntk' needs an MLPSpec / CNNSpec prior"
      )
    if self.input_norm not in INPUT_NORMS:
      raise ValueError(f"input_norm must be one of {INPUT_NORMS}, got {self.input_norm!r}")
    if self.input_clip is not None and not self.input_clip > 0:
      raise ValueError(f"input_clip must be positive or None, got {self.input_clip}")

  @property
  def deep(self) -> bool:
    """The paper's form: normalised free towers, diagonal-weighted loss, paired contexts."""
    return self.normalize and self.loss_weighting == "diagonal"

  @property
  def matched(self) -> bool:
    """φ = ϕ̂ frozen and ψ linear: g is linear in its parameters (module docstring)."""
    return self.feature_net is None and self.context_net is None

  @property
  def tx(self) -> optax.GradientTransformation:
    base = self.optimizer if self.optimizer is not None else default_optimizer(self)
    if self.precondition_jitter > 0:
      return optax.chain(preconditioner.context_preconditioner(), base)
    return base


# The deep form's settings (the benchmark's, tuned on its tuning split: docs/results.md).
# ``deep_form`` takes them as defaults, the benchmark kit's CSD config reads them from here.
DEEP_DEFAULTS = dict(
    embed_dim=256, lr=1e-3, adam_eps=1e-5, anneal=True, num_steps=1200, batch_size=128
)


def deep_form(
    prior: models.Net,
    tower: models.Net,
    *,
    num_steps: int = DEEP_DEFAULTS["num_steps"],
    embed_dim: int = DEEP_DEFAULTS["embed_dim"],
    lr: float = DEEP_DEFAULTS["lr"],
    adam_eps: float = DEEP_DEFAULTS["adam_eps"],
    anneal: bool = DEEP_DEFAULTS["anneal"],
    shared_torso: bool = False,
    input_norm: str = "none",
    input_clip: float | None = None,
) -> CSD:
  """The paper's deep CSD (Zanger's thesis App. B): a fixed random ``prior`` gives cosine
  labels of its last-layer features; φ and ψ are ``tower`` nets on raw inputs (separate, or
  one torso with two heads), unit-normalised, trained by Adam (``lr``, ``adam_eps``) with a
  linear anneal to 0 over ``num_steps`` on the diagonal-weighted pair loss. Pass the same
  ``num_steps`` to ``fit`` (with ``batch_size=DEEP_DEFAULTS["batch_size"]`` for the
  benchmark's estimator)."""
  if num_steps < 1:
    raise ValueError(f"num_steps must be positive, got {num_steps}")
  if not lr > 0:
    raise ValueError(f"lr must be positive, got {lr}")
  schedule = optax.linear_schedule(lr, 0.0, num_steps) if anneal else lr
  return CSD(
      prior=prior,
      feature_net=tower,
      context_net=None if shared_torso else tower,
      embed_dim=embed_dim,
      normalize=True,
      loss_weighting="diagonal",
      shared_torso=shared_torso,
      optimizer=optax.adam(schedule, eps=adam_eps),
      input_norm=input_norm,
      input_clip=input_clip,
  )


def default_optimizer(model: CSD) -> optax.GradientTransformation:
  """SGD with momentum for the linear (matched) form, Adam for free towers."""
  if model.matched:
    return optax.sgd(0.5, momentum=0.99, nesterov=True)
  return optax.adam(1e-3)


class CSDState(NamedTuple):
  """Everything that changes during training, as a pytree.

  params: {"feature": ..., "context": ...} (the feature entry is empty for φ = ϕ̃).
  opt_state: optax state of ``params``.
  prior_params: the prior net's params at init (fixed).
  label_scale: () mean k(x, x) over the training data.
  step: () int32.
  input_mean, input_std: μ and σ of ``CSD.input_norm``, each of one input's shape (None when
    ``input_norm="none"``).
  """

  params: PyTree
  opt_state: PyTree
  prior_params: PyTree
  label_scale: Array
  step: Array
  input_mean: Array | None = None
  input_std: Array | None = None


class _Tower(nn.Module):
  """One side of g: a free SpecNet on the raw input, or linear on ϕ̂ (None spec)."""

  spec: models.Spec | None
  out_dim: int
  zero_head: bool

  @nn.compact
  def __call__(self, x: Array, phi_hat: Array, update_stats: bool = False) -> Array:
    """``update_stats``: store a spectrally normalised spec's advanced power iteration."""
    if self.spec is None:
      init = nn.initializers.zeros if self.zero_head else nn.initializers.lecun_normal()
      return nn.Dense(self.out_dim, use_bias=False, kernel_init=init, name="linear")(phi_hat)
    if not models.is_spec(self.spec):  # a user's module, then a linear head to out_dim
      h = self.spec(x)  # adopted as the submodule "spec"
      return nn.Dense(self.out_dim, name="head")(h.reshape((h.shape[0], -1)))
    spec = dataclasses.replace(self.spec, out_dim=self.out_dim, dropout_rate=0.0)
    return models.SpecNet(spec, name="net")(x, update_stats=update_stats)


class _SharedTowers(nn.Module):
  """φ and ψ as two linear heads on one SpecNet torso: (B, ...) -> ((B, d), (B, d))."""

  spec: models.Spec
  out_dim: int

  @nn.compact
  def __call__(self, x: Array, update_stats: bool = False) -> tuple[Array, Array]:
    if models.is_spec(self.spec):
      torso = models.SpecNet(dataclasses.replace(self.spec, dropout_rate=0.0), name="torso")
      h = torso.features(x, update_stats=update_stats)
    else:
      h = self.spec(x)
      h = h.reshape((h.shape[0], -1))
    return nn.Dense(self.out_dim, name="phi")(h), nn.Dense(self.out_dim, name="psi")(h)


def _unit(v: Array) -> Array:
  """Rows of ``v`` scaled to unit L2 norm: (B, d)."""
  return v / jnp.maximum(jnp.linalg.norm(v, axis=-1, keepdims=True), 1e-12)


def prior_apply(model: CSD) -> Callable[[PyTree, Array], Array]:
  """``f(params, x)``: the prior net's output with dropout off (the function neural-tangents'
  ``empirical_ntk_fn`` differentiates for the ``"ntk"`` label kernel)."""
  net = models.module(dataclasses.replace(model.prior, dropout_rate=0.0))
  return lambda p, x: net.apply(p, x)


def input_stats(x_train: Array, mode: str) -> tuple[Array, Array]:
  """(μ, σ) over ``x_train`` (N, ...), each of one input's shape, σ floored at ``STD_FLOOR``
  (constant pixels, e.g. MNIST's border, would otherwise divide by 0).

  ``mode``: one of ``INPUT_NORMS``: ``"pixel"`` (per pixel / feature), ``"global"`` (one scalar
  each, broadcast) or ``"none"`` (μ = 0, σ = 1)."""
  if mode not in INPUT_NORMS:
    raise ValueError(f"input normalisation must be one of {INPUT_NORMS}, got {mode!r}")
  x = jnp.asarray(x_train, jnp.float32)
  if mode == "none":
    return jnp.zeros(x.shape[1:], jnp.float32), jnp.ones(x.shape[1:], jnp.float32)
  if mode == "pixel":
    mean, std = x.mean(0), x.std(0)
  else:
    mean, std = jnp.full(x.shape[1:], x.mean()), jnp.full(x.shape[1:], x.std())
  return mean, jnp.maximum(std, STD_FLOOR)


def standardize(x: Array, mean: Array, std: Array, clip: float | None) -> Array:
  """x̃ = clip((x − μ) / σ, ±clip) (no clip for None): (B, ...) -> (B, ...)."""
  z = (x - mean) / std
  return z if clip is None else jnp.clip(z, -clip, clip)


def preprocess(model: CSD, state: CSDState, x: Array) -> Array:
  """The inputs every net of the model sees: x̃ = clip((x − μ)/σ, ±input_clip), or ``x``
  itself when ``input_norm="none"``: (B, ...) -> (B, ...)."""
  if model.input_norm == "none":
    return x
  if state.input_mean is None:
    raise ValueError(
        f"input_norm={model.input_norm!r} needs the state's input_mean / "
        "input_std: build the state with csd.init"
    )
  return standardize(x, state.input_mean, state.input_std, model.input_clip)


@functools.lru_cache(maxsize=32)
def _ntk_fn(model: CSD):
  nt = _nt_compat.nt()
  return nt.empirical_ntk_fn(
      prior_apply(model),
      trace_axes=(-1,),
      vmap_axes=0,
      implementation=nt.NtkImplementation.JACOBIAN_CONTRACTION,
  )


def _phi_hat(model: CSD, state_or_prior: PyTree, x: Array, label_scale: Array) -> Array:
  """ϕ̂ = ϕ̃ / √label_scale, so that ϕ̂·ϕ̂ are the normalised labels."""
  return models.last_layer_features(model.prior, state_or_prior, x) / jnp.sqrt(label_scale)


def _embed_dim(model: CSD, prior_params: PyTree, x: Array) -> int:
  if model.feature_net is not None:
    return model.embed_dim
  return jax.eval_shape(lambda: models.last_layer_features(model.prior, prior_params, x[:1])).shape[
      -1
  ]


def _towers(model: CSD, d: int) -> tuple[_Tower, _Tower]:
  """Separate towers (``_SharedTowers`` serves ``shared_torso``)."""
  return (
      _Tower(model.feature_net, d, zero_head=False),
      _Tower(model.context_net, d, zero_head=not model.normalize),
  )


def label_block(model: CSD, prior_params: PyTree, x: Array, c: Array) -> Array:
  """Labels k(x_i, c_j): (Bx, Bc); with ``normalize``, the cosines of the prior's features."""
  if model.label_kernel == "last_layer":
    fx = models.last_layer_features(model.prior, prior_params, x)
    fc = models.last_layer_features(model.prior, prior_params, c)
    if model.normalize:
      fx, fc = _unit(fx), _unit(fc)
    return fx @ fc.T
  return _ntk_fn(model)(x, c, prior_params)


def pair_loss(pred: Array, labels: Array, weighting: str = "block") -> Array:
  """½ × the weighted mean squared error over a (Bx, Bc) block of pairs.

  ``"block"``: the mean over all Bx·Bc entries. ``"diagonal"`` (Bx = Bc, row i paired with
  context i): mean over the B diagonal entries + mean over the B(B − 1) off-diagonal ones, so
  the pairs g(x, x) is queried on weigh as much as all the others together.
  """
  chex.assert_equal_shape([pred, labels])
  err = (pred - labels) ** 2
  if weighting == "block":
    return 0.5 * jnp.mean(err)
  if weighting != "diagonal":
    raise ValueError(f"weighting must be one of {LOSS_WEIGHTINGS}, got {weighting!r}")
  b = err.shape[0]
  if err.shape[1] != b or b < 2:
    raise ValueError(
        f"weighting='diagonal' needs a square block of at least 2 × 2, got " f"{err.shape}"
    )
  diag = jnp.diagonal(err)
  off = (jnp.sum(err) - jnp.sum(diag)) / (b * (b - 1))
  return 0.5 * (jnp.mean(diag) + off)


def prior_variance(model: CSD, prior_params: PyTree, x: Array) -> Array:
  """k(x, x), the prior variance of the infinite ensemble: (B,)."""
  if model.label_kernel == "last_layer":
    f = models.last_layer_features(model.prior, prior_params, x)
    return jnp.sum(f * f, axis=-1)
  fn = _ntk_fn(model)
  return jax.vmap(lambda xi: fn(xi[None], None, prior_params)[0, 0])(x)


def _towers_read_prior(model: CSD) -> bool:
  """Whether φ or ψ is linear on the prior's features ϕ̂ (else both are free nets)."""
  return model.feature_net is None or model.context_net is None


def _embeddings(
    model: CSD,
    state: CSDState,
    params: PyTree,
    x: Array,
    c: Array,
    phi_x: Array | None = None,
    unit: bool = True,
) -> tuple[Array, Array]:
  """(φ(x), ψ(c)); ``phi_x``: ϕ̂(x) when the caller already has it; ``unit=False``: before
  ``normalize``'s scaling to unit length."""
  d = _embed_dim(model, state.prior_params, x)
  if model.shared_torso:  # one torso pass over [x; c] (or x alone for queries)
    net = _SharedTowers(model.feature_net, d)
    if c is x:
      emb_x, emb_c = net.apply(params["shared"], x)
    else:
      phi_all, psi_all = net.apply(params["shared"], jnp.concatenate([x, c]))
      emb_x, emb_c = phi_all[: x.shape[0]], psi_all[x.shape[0] :]
  else:
    feat, ctx = _towers(model, d)
    if _towers_read_prior(model):  # a linear tower on ϕ̂
      if phi_x is None:
        phi_x = _phi_hat(model, state.prior_params, x, state.label_scale)
      phi_c = phi_x if c is x else _phi_hat(model, state.prior_params, c, state.label_scale)
    else:  # free towers see only the raw inputs: no prior pass
      phi_c = None
    emb_x = phi_x if model.feature_net is None else feat.apply(params["feature"], x, phi_x)
    emb_c = ctx.apply(params["context"], c, phi_c)
  if model.normalize and unit:
    return _unit(emb_x), _unit(emb_c)
  return emb_x, emb_c


@functools.partial(jax.jit, static_argnums=0)
def tower_outputs(model: CSD, state: CSDState, x: Array) -> tuple[Array, Array]:
  """(φ(x), ψ(x)), each (B, d), before the deep form's scaling to unit length: what the towers
  learn, e.g. their norms and angle on inputs far from the data. ``x``: raw inputs."""
  x = preprocess(model, state, x)
  return _embeddings(model, state, state.params, x, x, unit=False)


def init(model: CSD, key: Array, x_train: Array, *, prior_params: PyTree | None = None) -> CSDState:
  """Initialises the prior f (unless given), the towers and the optimizer.

  Args:
    model: the estimator's definition.
    key: PRNG key.
    x_train: (N, ...) training inputs, raw; their mean k(x, x) sets ``label_scale``
      (the first 1024 are used), all of them ``input_norm``'s μ and σ.
    prior_params: use this prior instead of a fresh random one (e.g. a trained
      classifier's params, or one shared with other code).
  """
  check_array("x_train", x_train, min_rank=2)
  k_prior, k_feat, k_ctx = jax.random.split(key, 3)
  mean, std = (None, None) if model.input_norm == "none" else input_stats(x_train, model.input_norm)
  x_train = preprocess(model, CSDState(None, None, None, None, None, mean, std), x_train[:1024])
  if prior_params is None:
    prior_params = models.module(model.prior).init(k_prior, x_train[:1])
  label_scale = jnp.mean(prior_variance(model, prior_params, x_train[:1024]))
  d = _embed_dim(model, prior_params, x_train)
  if model.shared_torso:
    params = {"shared": _SharedTowers(model.feature_net, d).init(k_feat, x_train[:1])}
  else:
    feat, ctx = _towers(model, d)
    phi = models.last_layer_features(model.prior, prior_params, x_train[:1])
    params = {"context": ctx.init(k_ctx, x_train[:1], phi)}
    params["feature"] = {} if model.feature_net is None else feat.init(k_feat, x_train[:1], phi)
    if model.context_net is not None and not model.normalize:  # zero head: g₀ ≡ 0
      tower = params["context"]["params"]
      holder = tower["net"] if models.is_spec(model.context_net) else tower  # a module's head
      holder["head"] = jax.tree_util.tree_map(jnp.zeros_like, holder["head"])
  return CSDState(
      params=params,
      opt_state=model.tx.init(params),
      prior_params=prior_params,
      label_scale=label_scale,
      step=jnp.zeros((), jnp.int32),
      input_mean=mean,
      input_std=std,
  )


def loss(model: CSD, state: CSDState, params: PyTree, x: Array, c: Array) -> Array:
  """``pair_loss`` of g(x_i, c_j) against k(x_i, c_j)/label_scale over the (Bx, Bc) block
  (with ``normalize``: against the cosine labels, no scale). ``x``, ``c``: raw inputs
  (``preprocess`` is applied here)."""
  x = preprocess(model, state, x)
  c = x if c is x else preprocess(model, state, c)
  labels = label_block(model, state.prior_params, x, c)
  if not model.normalize:
    labels = labels / state.label_scale
  emb_x, emb_c = _embeddings(model, state, params, x, c)
  return pair_loss(emb_x @ emb_c.T, jax.lax.stop_gradient(labels), model.loss_weighting)


def feature_loss(model: CSD, params: PyTree, phi_x: Array, phi_c: Array) -> Array:
  """``loss`` of matched towers from precomputed ϕ̂ rows (Bx, d), (Bc, d): the labels are
  ϕ̂(x)ᵀϕ̂(c) and g(x, c) = ϕ̂(x)ᵀψ(c)."""
  _, ctx = _towers(model, phi_x.shape[-1])
  emb_c = ctx.apply(params["context"], phi_c, phi_c)
  return pair_loss(phi_x @ emb_c.T, phi_x @ phi_c.T, model.loss_weighting)


def apply_gradients(
    model: CSD, state: CSDState, loss_fn: Callable[[PyTree], Array]
) -> tuple[CSDState, dict]:
  value, grads = jax.value_and_grad(loss_fn)(state.params)
  updates, opt_state = model.tx.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  return state._replace(params=params, opt_state=opt_state, step=state.step + 1), {"loss": value}


def spectral_norm_towers(model: CSD) -> bool:
  """Whether a free tower is a spec with ``spectral_norm`` (its params then hold flax
  ``nn.SpectralNorm``'s power-iteration vectors in a ``batch_stats`` collection)."""
  nets = (model.feature_net, model.context_net)
  return any(n is not None and models.is_spec(n) and n.spectral_norm is not None for n in nets)


def refresh_spectral_norm(model: CSD, state: CSDState, x: Array) -> CSDState:
  """``state`` with the towers' stored power-iteration vectors advanced one step on their
  current kernels (flax ``nn.SpectralNorm`` with ``update_stats``); as given without
  ``spectral_norm_towers``. ``x``: raw inputs (B, ...); one row is used (the iteration does
  not depend on it). The vectors get zero gradients, so the optimizer leaves them alone."""
  if not spectral_norm_towers(model):
    return state
  x = preprocess(model, state, x[:1])
  d = _embed_dim(model, state.prior_params, x)
  params = dict(state.params)

  def refreshed(net, variables, *args):
    if "batch_stats" not in variables:
      return variables
    _, stats = net.apply(variables, *args, update_stats=True, mutable=["batch_stats"])
    return {**variables, **stats}

  if model.shared_torso:
    params["shared"] = refreshed(_SharedTowers(model.feature_net, d), params["shared"], x)
  else:
    feat, ctx = _towers(model, d)
    if model.feature_net is not None:
      params["feature"] = refreshed(feat, params["feature"], x, None)
    if model.context_net is not None:
      params["context"] = refreshed(ctx, params["context"], x, None)
  return state._replace(params=params)


@functools.partial(jax.jit, static_argnums=0)
def train_step(model: CSD, state: CSDState, x: Array, c: Array) -> tuple[CSDState, dict]:
  """One optimiser step on the label block of a batch, then (``spectral_norm_towers``) one
  power-iteration step of the towers' spectral norms (``refresh_spectral_norm``).

  Args:
    model: the definition (static).
    state: current state.
    x: (Bx, ...) training inputs. c: (Bc, ...) contexts.

  Returns:
    (new state, {"loss": ()}).
  """
  chex.assert_equal_shape_suffix([x, c], x.ndim - 1)
  if model.loss_weighting == "diagonal" and x.shape[0] != c.shape[0]:
    raise ValueError(
        f"loss_weighting='diagonal' pairs x_i with c_i: x and c need the same "
        f"batch size, got {x.shape[0]} and {c.shape[0]}"
    )
  state, metrics = apply_gradients(model, state, lambda p: loss(model, state, p, x, c))
  return refresh_spectral_norm(model, state, x), metrics


@functools.partial(jax.jit, static_argnums=(0, 3))
def _variance(
    model: CSD, state: CSDState, x: Array, relative: bool = False
) -> tuple[Array, Array, Array]:
  """(V or, with ``relative`` and free normalised towers, 1 − cos; k(x, x) or ones; count)."""
  if model.input_norm != "none":
    if isinstance(x, models.OneHotProduct):
      raise ValueError("input_norm needs array queries, not a OneHotProduct")
    x = preprocess(model, state, x)
  if relative and model.normalize and not _towers_read_prior(model):
    # V/k(x,x) = 1 − cos(φ(x), ψ(x)): the two towers alone, no pass of the prior
    emb_x, emb_c = _embeddings(model, state, state.params, x, x)
    rel = 1.0 - jnp.sum(emb_x * emb_c, axis=-1)
    return rel, jnp.ones_like(rel), jnp.sum(rel > 1.0)
  phi = _phi_hat(model, state.prior_params, x, state.label_scale)  # one pass of the prior
  emb_x, emb_c = _embeddings(model, state, state.params, x, x, phi_x=phi)
  if model.label_kernel == "last_layer":
    prior = state.label_scale * jnp.sum(phi * phi, axis=-1)
  else:
    prior = prior_variance(model, state.prior_params, x)
  if model.normalize:  # V = k(x,x)(1 − cos) ∈ [0, 2k]: kept whole, cos < 0 counted
    raw = prior * (1.0 - jnp.sum(emb_x * emb_c, axis=-1))
    return raw, prior, jnp.sum(raw > prior)
  raw = prior - state.label_scale * jnp.sum(emb_x * emb_c, axis=-1)
  return jnp.clip(raw, 0.0, prior), prior, jnp.sum((raw < 0) | (raw > prior))


def variance(
    model: CSD, state: CSDState, x: Array, *, relative: bool = False, batch_size: int = 4096
) -> tuple[Array, Array]:
  """CSD variance V(x) = k(x,x) − g(x,x), clipped to [0, k(x,x)].

  The NTK-GP variance lies in that range (``g(x,x) = k(x,X)k(X,X)⁻¹k(X,x) ≥ 0`` and ≤ the
  prior); a partly trained g can step outside it (g(x,x) < 0 or > k(x,x)), and such estimates
  are clipped to the nearer end and counted. One forward pass of the prior gives both g and
  (last-layer kernel) k(x, x). With ``normalize`` (the deep form), V = k(x,x)(1 − cos(φ(x),
  ψ(x))) ∈ [0, 2k(x,x)] is not clipped (a negative cosine ranks as more novel than a zero
  one); the count is then of estimates above k(x,x). Its relative form 1 − cos needs the two
  towers only: free towers then skip the prior's forward pass.

  Args:
    x: (M, ...) queries, processed ``batch_size`` at a time; or a ``models.OneHotProduct``
      (MLP nets), processed in one pass.
    relative: return V(x)/k(x,x) ∈ [0, 1] (the fraction of the prior variance the training
      data leaves unexplained; deep form: 1 − cos ∈ [0, 2]) instead of V(x).

  Returns:
    (variances (M,), number of raw estimates outside [0, k(x,x)] ()).
  """
  if isinstance(x, models.OneHotProduct):
    check_array("x.x", x.x, rank=2)
    _check_input_shape(model, state, models.OneHotProduct(x.x[:1], x.num), x.shape[1:])
    outs = [_variance(model, state, x, relative)]
  else:
    check_array("x", x, min_rank=2)
    _check_input_shape(model, state, x[:1], x.shape[1:])
    outs = [
        _variance(model, state, x[i : i + batch_size], relative)
        for i in range(0, x.shape[0], batch_size)
    ]
  v = jnp.concatenate([o[0] for o in outs])
  if relative:
    v = v / jnp.maximum(jnp.concatenate([o[1] for o in outs]), 1e-12)
  return v, sum(o[2] for o in outs)


def _check_input_shape(
    model: CSD, state: CSDState, x: Array | models.OneHotProduct, per_example: tuple[int, ...]
) -> None:
  """A ValueError naming the queries' ``per_example`` shape when the nets' params do not fit
  them (flax would raise ``ScopeParamShapeError`` from deep inside the forward pass). ``x``:
  the first query (of a ``OneHotProduct``, the pairs of its first row)."""
  try:
    jax.eval_shape(functools.partial(_variance, model), state, x)
  except flax.errors.FlaxError as e:
    raise ValueError(
        f"x has per-example shape {tuple(per_example)}, which the nets' params "
        f"do not fit (they were built for other inputs): {e}"
    ) from None


def _sample_contexts(
    key: Array,
    x_train: Array,
    extra: Array | None,
    augment: AugmentFn | None,
    size: int,
    extra_fraction: float,
    paired: Array | None = None,
) -> Array:
  """A context batch: from X (or ``paired``: c_i = paired_i), each row replaced with
  probability ``extra_fraction`` by its augmentation (``augment``) or by an ``extra`` row; with
  both, a replaced row is either with probability ½ each (one draw decides, so the total
  replacement probability stays ``extra_fraction``)."""
  k_idx, k_extra, k_mix, k_aug = jax.random.split(key, 4)
  if paired is None:
    c = x_train[jax.random.randint(k_idx, (size,), 0, x_train.shape[0])]
  else:
    c = paired
  shape = (-1,) + (1,) * (c.ndim - 1)
  if augment is not None and extra is not None:  # one draw: u < p/2 augmented, p/2 <= u < p extra
    u = jax.random.uniform(k_mix, (size,))
    use_aug, use_extra = u < 0.5 * extra_fraction, (u >= 0.5 * extra_fraction) & (
        u < extra_fraction
    )
  else:
    use_aug = jax.random.uniform(k_mix, (size,)) < extra_fraction
    use_extra = jax.random.uniform(jax.random.fold_in(k_mix, 1), (size,)) < extra_fraction
  c_new = c
  if augment is not None:
    c_new = jnp.where(use_aug.reshape(shape), augment(k_aug, c), c_new)
  if extra is not None:
    e = extra[jax.random.randint(k_extra, (size,), 0, extra.shape[0])]
    c_new = jnp.where(use_extra.reshape(shape), e, c_new)
  return c_new


def sample_batch(
    model: CSD,
    key: Array,
    x_train: Array,
    extra: Array | None,
    augment: AugmentFn | None,
    batch_size: int,
    context_batch_size: int,
    extra_fraction: float,
) -> tuple[Array, Array]:
  """One training batch (x (Bx, ...), c (Bc, ...)), drawn on device.

  Block loss: contexts drawn independently of x (``_sample_contexts``). Diagonal loss
  (``loss_weighting="diagonal"``): c_i = x_i, replaced with probability ``extra_fraction`` by
  its augmentation or by a random ``extra`` row, so the diagonal holds the pairs g(x, x) is
  queried on (Bc must equal Bx).
  """
  k_x, k_c = jax.random.split(key)
  x = x_train[jax.random.randint(k_x, (batch_size,), 0, x_train.shape[0])]
  if model.loss_weighting == "diagonal":
    if context_batch_size != batch_size:
      raise ValueError(
          f"loss_weighting='diagonal' pairs contexts with inputs: "
          f"context_batch_size ({context_batch_size}) must equal batch_size "
          f"({batch_size})"
      )
    return x, _sample_contexts(k_c, x_train, extra, augment, batch_size, extra_fraction, paired=x)
  return x, _sample_contexts(k_c, x_train, extra, augment, context_batch_size, extra_fraction)


def label_features(model: CSD, state: CSDState, x: Array, *, batch_size: int = 1024) -> Array:
  """ϕ̂(x) = ϕ̃(x)/√label_scale: (M, d), the prior's last-layer features, ``batch_size`` at a
  time."""
  check_array("x", x, min_rank=2)
  return models.batched_last_layer_features(
      model.prior, state.prior_params, preprocess(model, state, x), batch_size=batch_size
  ) / jnp.sqrt(state.label_scale)
