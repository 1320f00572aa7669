"""Contextual Similarity Distillation: the variance of an infinite ensemble from one model.

Notation (DESIGN.md §1): training inputs X, context set C, prior net f at its random
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

Matched towers (both None) train on the prior's features only, so ``fit`` computes ϕ̂ of X and
of the context set once and runs its steps on those rows (unless contexts are augmented on the
fly); ``precondition_jitter`` > 0 adds ``context_preconditioner`` (see there).

Labels are divided by ``label_scale`` = the mean of k(x, x) over the training data
(fixed at ``init``), so the regression targets are O(1) whatever the kernel's scale.

Every function is pure: params, optimizer state and PRNG keys go in and come out.
``train_step`` and ``variance`` are jitted; ``fit`` is the loop, data-parallel over a
``jax.sharding.Mesh`` when given one (batch axis sharded, params replicated).
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import time
from typing import Any, Callable, NamedTuple

import chex
import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from csd_jax import _nt_compat
from csd_jax import checkpoint
from csd_jax import models
from csd_jax import parallel
from csd_jax.validate import check_array

Array = jax.Array
PyTree = Any
AugmentFn = Callable[[Array, Array], Array]  # (key, images) -> images

LABEL_KERNELS = ("last_layer", "ntk")
# "block": the mean over all Bx × Bc pairs; "diagonal": mean over the pairs (x_i, c_i) plus
# mean over the pairs (x_i, c_j≠i), equal weight (``pair_loss``).
LOSS_WEIGHTINGS = ("block", "diagonal")


@dataclasses.dataclass(frozen=True)
class CSD:
  """Static definition of a CSD estimator (hashable: it is a jit static argument).

  Attributes:
    prior: spec of the prior net f; labels come from f at its random init.
    feature_net: spec of φ on raw inputs, or None for φ = ϕ̃ (module docstring).
    context_net: spec of ψ on raw contexts, or None for ψ = W ϕ̃.
    embed_dim: output size of free towers; ignored (= dim ϕ̃) when feature_net is None.
    label_kernel: ``"last_layer"`` (Θ_L, default) or ``"ntk"`` (exact empirical NTK of f).
    optimizer: optax transformation; None picks ``default_optimizer``.
    precondition_jitter: matched towers only; ε > 0 chains ``context_preconditioner`` before
      the optimizer, with (Σ_C + ε tr(Σ_C) I)⁻¹ set by ``fit`` from the context distribution
      (``context_second_moment``); 0 = off.
    normalize: free towers, last-layer labels only: ϕ̃, φ, ψ scaled to unit length (g and the
      labels are cosine similarities; module docstring).
    loss_weighting: one of ``LOSS_WEIGHTINGS`` (``pair_loss``); ``"diagonal"`` needs Bx = Bc
      and contexts paired with the inputs.
    shared_torso: φ and ψ are two linear heads on one ``feature_net`` torso (``context_net``
      must be None or the same spec).
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

  def __post_init__(self):
    if self.label_kernel not in LABEL_KERNELS:
      raise ValueError(f"label_kernel must be one of {LABEL_KERNELS}, got {self.label_kernel!r}")
    if self.embed_dim < 1:
      raise ValueError(f"embed_dim must be positive, got {self.embed_dim}")
    if self.label_kernel == "ntk" and self.feature_net is None:
      raise ValueError("label_kernel='ntk' needs a feature_net: the frozen last-layer "
                       "features only represent the last-layer kernel")
    if not self.precondition_jitter >= 0.0:
      raise ValueError(f"precondition_jitter must be >= 0, got {self.precondition_jitter}")
    if self.precondition_jitter > 0 and not self.matched:
      raise ValueError("precondition_jitter > 0 needs matched towers (feature_net and "
                       "context_net None): it preconditions the linear context map")
    if self.loss_weighting not in LOSS_WEIGHTINGS:
      raise ValueError(f"loss_weighting must be one of {LOSS_WEIGHTINGS}, "
                       f"got {self.loss_weighting!r}")
    if self.normalize and (self.feature_net is None or self.label_kernel != "last_layer"):
      raise ValueError("normalize=True needs a feature_net (free towers) and "
                       "label_kernel='last_layer' (cosine labels of the prior's features)")
    if self.shared_torso and (self.feature_net is None or self.context_net not in (
        None, self.feature_net)):
      raise ValueError("shared_torso=True needs a feature_net, and context_net None or equal "
                       "to it (one torso, two heads)")

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
      return optax.chain(context_preconditioner(), base)
    return base


def default_optimizer(model: CSD) -> optax.GradientTransformation:
  """SGD with momentum for the linear (matched) form, Adam for free towers."""
  if model.matched:
    return optax.sgd(0.5, momentum=0.99, nesterov=True)
  return optax.adam(1e-3)


class PreconditionerState(NamedTuple):
  """matrix: (d, d), left-multiplies the gradient of the linear context map."""
  matrix: Array


def context_preconditioner() -> optax.GradientTransformation:
  """Left-multiplies the gradient of the matched context map ψ(c) = Kᵀϕ̂(c) by a (d, d) matrix.

  With g(x, c) = ϕ̂(c)ᵀKϕ̂(x) (K: the flax kernel, rows = context features) the mean squared
  loss over X × C has gradient Σ_C (K − I) Σ_X (Σ: feature second moments), so plain
  gradient descent shrinks the error along direction pairs at rate λ_X·λ_C: the early-stopped
  estimate then depends on the context distribution, and contexts with large features (e.g.
  OOD context) are learnt first, lowering V exactly where it should stay high. The matrix
  (Σ_C + εI)⁻¹ removes the C side (rate λ_X only: the kernel-regression flow of X's kernel) and
  leaves the converged solution unchanged.
  ``init`` sets the identity; ``precondition`` sets the matrix (``fit`` does, from the context
  distribution, when ``CSD.precondition_jitter`` > 0).
  """
  def init(params):
    d = params["context"]["params"]["linear"]["kernel"].shape[0]
    return PreconditionerState(jnp.eye(d, dtype=jnp.float32))

  def update(updates, state, params=None):
    del params
    ctx = dict(updates["context"])
    prm = dict(ctx["params"])
    lin = dict(prm["linear"])
    lin["kernel"] = state.matrix @ lin["kernel"]
    prm["linear"], ctx["params"] = lin, prm
    return {**updates, "context": ctx}, state

  return optax.GradientTransformation(init, update)


class CSDState(NamedTuple):
  """Everything that changes during training, as a pytree.

  params: {"feature": ..., "context": ...} (the feature entry is empty for φ = ϕ̃).
  opt_state: optax state of ``params``.
  prior_params: the prior net's params at init (fixed).
  label_scale: () mean k(x, x) over the training data.
  step: () int32.
  """
  params: PyTree
  opt_state: PyTree
  prior_params: PyTree
  label_scale: Array
  step: Array


class _Tower(nn.Module):
  """One side of g: a free SpecNet on the raw input, or linear on ϕ̂ (None spec)."""
  spec: models.Spec | None
  out_dim: int
  zero_head: bool

  @nn.compact
  def __call__(self, x: Array, phi_hat: Array) -> Array:
    if self.spec is None:
      init = nn.initializers.zeros if self.zero_head else nn.initializers.lecun_normal()
      return nn.Dense(self.out_dim, use_bias=False, kernel_init=init, name="linear")(phi_hat)
    spec = dataclasses.replace(self.spec, out_dim=self.out_dim, dropout_rate=0.0)
    return models.SpecNet(spec, name="net")(x)


class _SharedTowers(nn.Module):
  """φ and ψ as two linear heads on one SpecNet torso: (B, ...) -> ((B, d), (B, d))."""
  spec: models.Spec
  out_dim: int

  @nn.compact
  def __call__(self, x: Array) -> tuple[Array, Array]:
    torso = models.SpecNet(dataclasses.replace(self.spec, dropout_rate=0.0), name="torso")
    h = torso.features(x)
    return nn.Dense(self.out_dim, name="phi")(h), nn.Dense(self.out_dim, name="psi")(h)


def _unit(v: Array) -> Array:
  """Rows of ``v`` scaled to unit L2 norm: (B, d)."""
  return v / jnp.maximum(jnp.linalg.norm(v, axis=-1, keepdims=True), 1e-12)


def _prior_apply(model: CSD) -> Callable[[PyTree, Array], Array]:
  net = models.module(dataclasses.replace(model.prior, dropout_rate=0.0))
  return lambda p, x: net.apply(p, x)


@functools.lru_cache(maxsize=32)
def _ntk_fn(model: CSD):
  nt = _nt_compat.nt()
  return nt.empirical_ntk_fn(_prior_apply(model), trace_axes=(-1,), vmap_axes=0,
                             implementation=nt.NtkImplementation.JACOBIAN_CONTRACTION)


def _phi_hat(model: CSD, state_or_prior: PyTree, x: Array, label_scale: Array) -> Array:
  """ϕ̂ = ϕ̃ / √label_scale, so that ϕ̂·ϕ̂ are the normalised labels."""
  return models.last_layer_features(model.prior, state_or_prior, x) / jnp.sqrt(label_scale)


def _embed_dim(model: CSD, prior_params: PyTree, x: Array) -> int:
  if model.feature_net is not None:
    return model.embed_dim
  return jax.eval_shape(lambda: models.last_layer_features(model.prior, prior_params, x[:1])
                        ).shape[-1]


def _towers(model: CSD, d: int) -> tuple[_Tower, _Tower]:
  """Separate towers (``_SharedTowers`` serves ``shared_torso``)."""
  return (_Tower(model.feature_net, d, zero_head=False),
          _Tower(model.context_net, d, zero_head=not model.normalize))


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
    raise ValueError(f"weighting='diagonal' needs a square block of at least 2 × 2, got "
                     f"{err.shape}")
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


def _embeddings(model: CSD, state: CSDState, params: PyTree, x: Array, c: Array,
                phi_x: Array | None = None) -> tuple[Array, Array]:
  """(φ(x), ψ(c)); ``phi_x``: ϕ̂(x) when the caller already has it."""
  d = _embed_dim(model, state.prior_params, x)
  if model.shared_torso:  # one torso pass over [x; c] (or x alone for queries)
    net = _SharedTowers(model.feature_net, d)
    if c is x:
      emb_x, emb_c = net.apply(params["shared"], x)
    else:
      phi_all, psi_all = net.apply(params["shared"], jnp.concatenate([x, c]))
      emb_x, emb_c = phi_all[:x.shape[0]], psi_all[x.shape[0]:]
  else:
    feat, ctx = _towers(model, d)
    if phi_x is None:
      phi_x = _phi_hat(model, state.prior_params, x, state.label_scale)
    phi_c = phi_x if c is x else _phi_hat(model, state.prior_params, c, state.label_scale)
    emb_x = phi_x if model.feature_net is None else feat.apply(params["feature"], x, phi_x)
    emb_c = ctx.apply(params["context"], c, phi_c)
  if model.normalize:
    return _unit(emb_x), _unit(emb_c)
  return emb_x, emb_c


def init(model: CSD, key: Array, x_train: Array, *, prior_params: PyTree | None = None
         ) -> CSDState:
  """Initialises the prior f (unless given), the towers and the optimizer.

  Args:
    model: the estimator's definition.
    key: PRNG key.
    x_train: (N, ...) training inputs; their mean k(x, x) sets ``label_scale``
      (the first 1024 are used).
    prior_params: use this prior instead of a fresh random one (e.g. a trained
      classifier's params, or one shared with other code).
  """
  check_array("x_train", x_train, min_rank=2)
  k_prior, k_feat, k_ctx = jax.random.split(key, 3)
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
      net = params["context"]["params"]["net"]
      net["head"] = jax.tree_util.tree_map(jnp.zeros_like, net["head"])
  return CSDState(params=params, opt_state=model.tx.init(params), prior_params=prior_params,
                  label_scale=label_scale, step=jnp.zeros((), jnp.int32))


def loss(model: CSD, state: CSDState, params: PyTree, x: Array, c: Array) -> Array:
  """``pair_loss`` of g(x_i, c_j) against k(x_i, c_j)/label_scale over the (Bx, Bc) block
  (with ``normalize``: against the cosine labels, no scale)."""
  labels = label_block(model, state.prior_params, x, c)
  if not model.normalize:
    labels = labels / state.label_scale
  emb_x, emb_c = _embeddings(model, state, params, x, c)
  return pair_loss(emb_x @ emb_c.T, jax.lax.stop_gradient(labels), model.loss_weighting)


def _feature_loss(model: CSD, params: PyTree, phi_x: Array, phi_c: Array) -> Array:
  """``loss`` of matched towers from precomputed ϕ̂ rows (Bx, d), (Bc, d): the labels are
  ϕ̂(x)ᵀϕ̂(c) and g(x, c) = ϕ̂(x)ᵀψ(c)."""
  _, ctx = _towers(model, phi_x.shape[-1])
  emb_c = ctx.apply(params["context"], phi_c, phi_c)
  return 0.5 * jnp.mean((phi_x @ emb_c.T - phi_x @ phi_c.T) ** 2)


def _apply_gradients(model: CSD, state: CSDState, loss_fn: Callable[[PyTree], Array]
                     ) -> tuple[CSDState, dict]:
  value, grads = jax.value_and_grad(loss_fn)(state.params)
  updates, opt_state = model.tx.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  return state._replace(params=params, opt_state=opt_state, step=state.step + 1), {
      "loss": value}


@functools.partial(jax.jit, static_argnums=0)
def train_step(model: CSD, state: CSDState, x: Array, c: Array) -> tuple[CSDState, dict]:
  """One optimiser step on the label block of a batch.

  Args:
    model: the definition (static).
    state: current state.
    x: (Bx, ...) training inputs. c: (Bc, ...) contexts.

  Returns:
    (new state, {"loss": ()}).
  """
  chex.assert_equal_shape_suffix([x, c], x.ndim - 1)
  if model.loss_weighting == "diagonal" and x.shape[0] != c.shape[0]:
    raise ValueError(f"loss_weighting='diagonal' pairs x_i with c_i: x and c need the same "
                     f"batch size, got {x.shape[0]} and {c.shape[0]}")
  return _apply_gradients(model, state, lambda p: loss(model, state, p, x, c))


@functools.partial(jax.jit, static_argnums=0)
def _variance(model: CSD, state: CSDState, x: Array) -> tuple[Array, Array, Array]:
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


def variance(model: CSD, state: CSDState, x: Array, *, relative: bool = False,
             batch_size: int = 4096) -> tuple[Array, Array]:
  """CSD variance V(x) = k(x,x) − g(x,x), clipped to [0, k(x,x)].

  The NTK-GP variance lies in that range (``g(x,x) = k(x,X)k(X,X)⁻¹k(X,x) ≥ 0`` and ≤ the
  prior); a partly trained g can step outside it (g(x,x) < 0 or > k(x,x)), and such estimates
  are clipped to the nearer end and counted. One forward pass of the prior gives both g and
  (last-layer kernel) k(x, x). With ``normalize`` (the deep form), V = k(x,x)(1 − cos(φ(x),
  ψ(x))) ∈ [0, 2k(x,x)] is not clipped (a negative cosine ranks as more novel than a zero
  one); the count is then of estimates above k(x,x).

  Args:
    x: (M, ...) queries, processed ``batch_size`` at a time.
    relative: return V(x)/k(x,x) ∈ [0, 1] (the fraction of the prior variance the training
      data leaves unexplained; deep form: 1 − cos ∈ [0, 2]) instead of V(x).

  Returns:
    (variances (M,), number of raw estimates outside [0, k(x,x)] ()).
  """
  check_array("x", x, min_rank=2)
  _check_input_shape(model, state, x)
  outs = [_variance(model, state, x[i:i + batch_size]) for i in range(0, x.shape[0], batch_size)]
  v = jnp.concatenate([o[0] for o in outs])
  if relative:
    v = v / jnp.maximum(jnp.concatenate([o[1] for o in outs]), 1e-12)
  return v, sum(o[2] for o in outs)


def _check_input_shape(model: CSD, state: CSDState, x: Array) -> None:
  """A ValueError naming ``x`` when the nets' params do not fit its per-example shape (flax
  would raise ``ScopeParamShapeError`` from deep inside the forward pass)."""
  try:
    jax.eval_shape(functools.partial(_variance, model), state, x[:1])
  except flax.errors.FlaxError as e:
    raise ValueError(f"x has per-example shape {tuple(x.shape[1:])}, which the nets' params "
                     f"do not fit (they were built for other inputs): {e}") from None


def _sample_contexts(key: Array, x_train: Array, extra: Array | None, augment: AugmentFn | None,
                     size: int, extra_fraction: float, paired: Array | None = None) -> Array:
  """A context batch: from X (or ``paired``: c_i = paired_i), each row replaced with
  probability ``extra_fraction`` by its augmentation (``augment``) or by an ``extra`` row."""
  k_idx, k_extra, k_mix, k_aug = jax.random.split(key, 4)
  if paired is None:
    c = x_train[jax.random.randint(k_idx, (size,), 0, x_train.shape[0])]
  else:
    c = paired
  if augment is not None:
    aug = augment(k_aug, c)
    use = jax.random.uniform(k_mix, (size,)) < extra_fraction
    c = jnp.where(use.reshape((-1,) + (1,) * (c.ndim - 1)), aug, c)
  if extra is not None:
    e = extra[jax.random.randint(k_extra, (size,), 0, extra.shape[0])]
    use = jax.random.uniform(jax.random.fold_in(k_mix, 1), (size,)) < extra_fraction
    c = jnp.where(use.reshape((-1,) + (1,) * (c.ndim - 1)), e, c)
  return c


def sample_batch(model: CSD, key: Array, x_train: Array, extra: Array | None,
                 augment: AugmentFn | None, batch_size: int, context_batch_size: int,
                 extra_fraction: float) -> tuple[Array, Array]:
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
      raise ValueError(f"loss_weighting='diagonal' pairs contexts with inputs: "
                       f"context_batch_size ({context_batch_size}) must equal batch_size "
                       f"({batch_size})")
    return x, _sample_contexts(k_c, x_train, extra, augment, batch_size, extra_fraction,
                               paired=x)
  return x, _sample_contexts(k_c, x_train, extra, augment, context_batch_size, extra_fraction)


def step_key(key: Array, step: Array) -> Array:
  """The PRNG key of ``fit``'s step ``step``: a function of the step index only, so the result
  does not depend on how the loop is chunked (logging, checkpoints, resumption)."""
  return jax.random.fold_in(key, step)


@functools.partial(jax.jit, static_argnums=(0, 6, 7, 8, 9, 10, 11, 12))
def _train_chunk(model: CSD, state: CSDState, key: Array, start: Array, x_train: Array,
                 extra: Array | None, augment: AugmentFn | None, batch_size: int,
                 context_batch_size: int, extra_fraction: float, num_steps: int, mesh: Any,
                 on_features: bool) -> tuple[CSDState, Array]:
  """Steps ``start .. start + num_steps - 1`` under one ``lax.scan``, batches sampled on
  device. ``on_features``: ``x_train`` / ``extra`` are ϕ̂ rows (matched towers, ``fit``)."""

  def body(state, step):
    x, c = sample_batch(model, step_key(key, step), x_train, extra, augment, batch_size,
                        context_batch_size, extra_fraction)
    x, c = parallel.constrain_batch(mesh, (x, c))
    if on_features:
      state, metrics = _apply_gradients(model, state,
                                        lambda p: _feature_loss(model, p, x, c))
    else:
      state, metrics = train_step(model, state, x, c)
    return state, metrics["loss"]

  return jax.lax.scan(body, state, start + jnp.arange(num_steps, dtype=jnp.uint32))


def features(model: CSD, state: CSDState, x: Array, *, batch_size: int = 1024) -> Array:
  """ϕ̂(x) = ϕ̃(x)/√label_scale: (M, d), the prior's last-layer features, ``batch_size`` at a
  time."""
  check_array("x", x, min_rank=2)
  return (models.batched_last_layer_features(model.prior, state.prior_params, x,
                                             batch_size=batch_size)
          / jnp.sqrt(state.label_scale))


def _second_moment(f: Array) -> Array:
  f = f.astype(jnp.float32)
  return f.T @ f / f.shape[0]


def _mixture_moment(phi_x: Array, phi_extra: Array | None, extra_fraction: float) -> Array:
  m = _second_moment(phi_x)
  if phi_extra is None:
    return m
  return (1.0 - extra_fraction) * m + extra_fraction * _second_moment(phi_extra)


def _context_rows(model: CSD, state: CSDState, x_train: Array, context: Array | None,
                  augment: AugmentFn | None, key: Array | None) -> tuple[Array, Array | None]:
  """ϕ̂ of X and of the extra context rows (``context``, or one augmentation of every row of X)."""
  if context is None and augment is not None:
    if key is None:
      raise ValueError("context_second_moment with augment needs a key")
    context = jax.jit(augment)(key, x_train)
  phi_c = None if context is None else features(model, state, context)
  return features(model, state, x_train), phi_c


def context_second_moment(model: CSD, state: CSDState, x_train: Array, *,
                          context: Array | None = None, augment: AugmentFn | None = None,
                          extra_fraction: float = 0.5, key: Array | None = None) -> Array:
  """Σ_C = E_c[ϕ̂(c)ϕ̂(c)ᵀ] (d, d) over the distribution ``fit`` draws contexts from: X with
  probability 1 − extra_fraction, else a ``context`` row or (with ``augment``) one
  augmentation of every row of X, drawn with ``key``."""
  phi_x, phi_c = _context_rows(model, state, x_train, context, augment, key)
  return _mixture_moment(phi_x, phi_c, extra_fraction)


# A context batch of B rows moves the context map by Σ_b P ϕ̂_b ϕ̂_bᵀ / B; one row of leverage
# q = ϕ̂ᵀPϕ̂ ≫ B (a rare input whose features lie along a direction Σ_C barely spans) kicks
# that direction q/B times harder than the population does. Measured on the embedded benchmark
# (ε = 1e-5, B = 128): max q = 281 (seed 0) fits like the closed form, 446 (seed 2: Spearman
# 0.31 to it, no NaN) and 999 (seed 4: diverged) do not. ``stable_jitter`` keeps max q ≤ 2B.
MAX_LEVERAGE_PER_BATCH = 2.0


def stable_jitter(second_moment: Array, rows, batch_size: int, floor: float,
                  max_leverage: float = MAX_LEVERAGE_PER_BATCH) -> float:
  """The smallest ε = floor · 2^k (k ≥ 0) with max_c ϕ̂(c)ᵀ(Σ_C + ε tr(Σ_C) I)⁻¹ϕ̂(c) ≤
  ``max_leverage`` · ``batch_size`` over the context rows (float64, host).

  Args:
    second_moment: (d, d) Σ_C.
    rows: arrays (n_i, d) of every row contexts are drawn from (X, extra contexts).
    batch_size: contexts per step.
    floor: the smallest ε (``CSD.precondition_jitter``), > 0.
  """
  if not floor > 0:
    raise ValueError(f"floor must be positive, got {floor}")
  m = np.asarray(second_moment, np.float64)
  lam, vec = np.linalg.eigh(m)
  proj = np.concatenate([np.asarray(r, np.float64) @ vec for r in rows if r is not None]) ** 2
  eps, bound = float(floor), max_leverage * batch_size
  for _ in range(40):
    if np.max(proj @ (1.0 / (np.maximum(lam, 0.0) + eps * np.trace(m)))) <= bound:
      break
    eps *= 2.0
  return eps


def precondition(model: CSD, state: CSDState, second_moment: Array,
                 jitter: float | None = None) -> CSDState:
  """Sets ``context_preconditioner``'s matrix to (Σ_C + ε tr(Σ_C) I)⁻¹, ε = ``jitter`` or
  ``model.precondition_jitter`` (computed in float64 on the host)."""
  if model.precondition_jitter <= 0:
    raise ValueError("precondition needs CSD.precondition_jitter > 0")
  eps = model.precondition_jitter if jitter is None else float(jitter)
  m = np.asarray(second_moment, np.float64)
  p = np.linalg.inv(m + eps * np.trace(m) * np.eye(m.shape[0]))
  first, *rest = state.opt_state
  return state._replace(opt_state=(first._replace(matrix=jnp.asarray(p, jnp.float32)), *rest))


def fit(model: CSD, state: CSDState, key: Array, x_train: Array, *, num_steps: int,
        batch_size: int = 256, context_batch_size: int | None = None,
        context: Array | None = None, augment: AugmentFn | None = None,
        extra_fraction: float = 0.5, mesh: Any = None, log_every: int = 500,
        checkpoint_dir: str | None = None, checkpoint_every: int = 0,
        verbose: bool = True) -> tuple[CSDState, dict]:
  """Trains g for ``num_steps`` steps on random (x, c) batches.

  Context choices (the three CSD variants):
    * CSD: neither ``context`` nor ``augment``: C = X.
    * CSD-Aug: ``augment(key, batch) -> batch``: each context drawn from X is replaced
      by its augmentation with probability ``extra_fraction``.
    * CSD-OOD: ``context`` (M, ...) unlabeled inputs: each context is drawn from it with
      probability ``extra_fraction``, else from X (keeping X ⊂ C, see module docstring).

  Args:
    model, state: as from ``init``.
    key: PRNG key for batch sampling (step t uses ``step_key(key, t)``).
    x_train: (N, ...) training inputs.
    num_steps: total optimiser steps (> 0).
    batch_size / context_batch_size: Bx and Bc (Bc defaults to Bx).
    mesh: a ``jax.sharding.Mesh`` with a ``"data"`` axis to run data-parallel.
    log_every: steps between progress lines (stderr) and history entries.
    (Matched towers without ``augment`` run on ϕ̂ of X and C computed once; with
    ``model.precondition_jitter`` > 0 the preconditioner is set here, before step 0.)
    checkpoint_dir: resume from / checkpoint to this folder (``csd_jax.checkpoint``); a run
      killed at any point and rerun with the same arguments ends bitwise equal (CPU) to an
      uninterrupted one. checkpoint_every: steps between checkpoints (0: only at the end).

  Returns:
    (trained state, {"step": [...], "loss": [...], "steps_per_s": float,
    "precondition_jitter": the ε used (``stable_jitter``) or None}).
  """
  check_array("x_train", x_train, min_rank=2)
  if context is not None:
    check_array("context", context, min_rank=2)
    if context.shape[1:] != x_train.shape[1:]:
      raise ValueError(f"context must have per-example shape {x_train.shape[1:]}, "
                       f"got {context.shape[1:]}")
  for name, v in (("num_steps", num_steps), ("batch_size", batch_size),
                  ("log_every", log_every)):
    if v < 1:
      raise ValueError(f"{name} must be positive, got {v}")
  context_batch_size = context_batch_size or batch_size
  if not 0.0 <= extra_fraction <= 1.0:
    raise ValueError(f"extra_fraction must be in [0, 1], got {extra_fraction}")
  identity = None if checkpoint_dir is None else dict(
      kind="csd", model=checkpoint.describe(model), key=checkpoint.key_id(key),
      x_train=checkpoint.fingerprint(x_train),
      context=None if context is None else checkpoint.fingerprint(context),
      augment=None if augment is None else checkpoint.describe(augment),
      num_steps=num_steps, batch_size=batch_size, context_batch_size=context_batch_size,
      extra_fraction=extra_fraction,
      init=checkpoint.fingerprint(*jax.tree_util.tree_leaves((state.params,
                                                               state.prior_params))))
  ckpt = checkpoint.Periodic(checkpoint_dir, checkpoint_every, identity)
  # Matched towers see inputs only through the frozen ϕ̂: compute it once for X and C.
  on_features = model.matched and augment is None
  if on_features:
    x_train = features(model, state, x_train)
    context = None if context is None else features(model, state, context)
  if mesh is not None:
    state = parallel.replicate(mesh, state)
    x_train = parallel.replicate(mesh, x_train)
    context = None if context is None else parallel.replicate(mesh, context)
  state, done, saved = ckpt.restore(state)
  jitter = None
  if model.precondition_jitter > 0 and done == 0:
    rows = (x_train, context) if on_features else _context_rows(
        model, state, x_train, context, augment, jax.random.split(key)[0])
    moment = _mixture_moment(*rows, extra_fraction)
    jitter = stable_jitter(moment, rows, context_batch_size, model.precondition_jitter)
    if jitter > model.precondition_jitter and verbose:
      print(f"csd fit: precondition_jitter raised {model.precondition_jitter:g} -> {jitter:g} "
            "(a context of high leverage: see csd.stable_jitter)", file=sys.stderr, flush=True)
    state = precondition(model, state, moment, jitter)
    if mesh is not None:
      state = parallel.replicate(mesh, state)
  history = {"step": list(saved.get("step", [])), "loss": list(saved.get("loss", []))}
  if done and verbose:
    print(f"csd fit: resumed from {checkpoint_dir} at step {done}", file=sys.stderr, flush=True)
  first, start = done, time.perf_counter()
  boundaries = (log_every, checkpoint_every or num_steps)
  while done < num_steps:
    n = min(min(b - done % b for b in boundaries), num_steps - done)
    state, losses = _train_chunk(model, state, key, jnp.uint32(done), x_train, context, augment,
                                 batch_size, context_batch_size, extra_fraction, n, mesh,
                                 on_features)
    if not bool(jnp.all(jnp.isfinite(losses))):
      raise FloatingPointError(
          f"csd fit diverged (non-finite loss) between steps {done} and {done + n}: lower the "
          "learning rate" + (" or raise precondition_jitter (the preconditioner amplifies "
                             "minibatch noise along weak feature directions)"
                             if model.precondition_jitter > 0 else ""))
    done += n
    if done % log_every == 0 or done == num_steps:
      history["step"].append(done)
      history["loss"].append(float(jnp.mean(losses)))
      if verbose:
        rate = (done - first) / (time.perf_counter() - start)
        print(f"csd fit: step {done}/{num_steps}  loss {history['loss'][-1]:.3e}  "
              f"{rate:.0f} steps/s", file=sys.stderr, flush=True)
    ckpt.maybe_save(done, state, num_steps, meta=history)
  ckpt.close()
  history["steps_per_s"] = (done - first) / max(time.perf_counter() - start, 1e-9)
  history["precondition_jitter"] = jitter  # the ε used (None: no preconditioner, or resumed)
  return state, history


# ----------------------------------------------------------------------------------------------
# Single-query CSD: the theorem of DESIGN.md §1 for one query x_t.
# ----------------------------------------------------------------------------------------------


def _scalar_outputs(apply_fn: Callable[[PyTree, Array], Array], params: PyTree, x: Array
                    ) -> Array:
  out = apply_fn(params, x)
  if out.size != x.shape[0]:
    raise ValueError(f"apply_fn must have one output per example ((B,) or (B, 1)), got shape "
                     f"{out.shape} for {x.shape[0]} inputs")
  return out.reshape(x.shape[0])


def single_query_predict(apply_fn: Callable[[PyTree, Array], Array], params: PyTree,
                         params0: PyTree, x: Array) -> Array:
  """The centred net g(x) = h(x, θ) − h(x, θ₀): (M,).

  Centring makes g start at exactly 0 without changing its NTK (the subtracted term does not
  depend on θ), the small-output init the single-query theorem needs.

  Args:
    apply_fn: ``apply_fn(params, x) -> (B,)`` or ``(B, 1)``: a scalar-output net h.
    params: θ (e.g. from ``fit_single_query``). params0: θ₀, the init g is centred at.
    x: (M, ...) inputs.
  """
  return _scalar_outputs(apply_fn, params, x) - _scalar_outputs(apply_fn, params0, x)


def _gram_lambda_max(apply_fn, params0: PyTree, x: Array, num_iters: int = 64) -> Array:
  """Largest eigenvalue of Θ̂(X, X) = J Jᵀ at θ₀ by power iteration with jvp/vjp (no Jacobian
  in memory). Returns the Rayleigh quotient, which is ≤ λ_max."""
  h = lambda p: _scalar_outputs(apply_fn, p, x)
  _, vjp = jax.vjp(h, params0)

  def gram_times(v):
    (u,) = vjp(v)
    return jax.jvp(h, (params0,), (u,))[1]

  n = x.shape[0]
  v0 = jnp.ones((n,), jax.eval_shape(h, params0).dtype) / jnp.sqrt(n)

  def body(_, v):
    w = gram_times(v)
    return w / jnp.linalg.norm(w)

  v = jax.lax.fori_loop(0, num_iters, body, v0)
  return jnp.vdot(v, gram_times(v))


@functools.partial(jax.jit, static_argnames=("apply_fn", "num_steps"))
def fit_single_query(apply_fn: Callable[[PyTree, Array], Array], params0: PyTree,
                     x_train: Array, labels: Array, *, num_steps: int,
                     learning_rate: float | Array | None = None) -> PyTree:
  """Trains the centred net g = h(·, θ) − h(·, θ₀) by full-batch gradient descent on labels.

  The single-query theorem (DESIGN.md §1): with labels ``Θ̂(X, x_t)``, gradient descent to
  convergence gives ``g(x) → Θ̂(x,X) Θ̂(X,X)⁻¹ Θ̂(X,x_t)`` — exactly for a model linear in its
  parameters, up to O(1/sqrt(width)) for a wide net in NTK parameterisation — so
  ``V(x_t) = Θ̂(x_t, x_t) − g(x_t)``. Loss ½ Σᵢ (g(xᵢ) − yᵢ)² (a sum, so that in function
  space ġ = −η Θ̂ (g − y) and η < 2/λ_max(Θ̂) is stable).

  θ₀ is a traced argument, not a closure constant: capturing wide params as constants makes
  XLA constant-fold for minutes (DESIGN.md §3). ``jax.vmap`` over ``labels`` trains several
  queries at once (one parameter copy each).

  Args:
    apply_fn: ``apply_fn(params, x) -> (B,)`` or ``(B, 1)`` (static: keep the same object
      between calls to reuse the compilation).
    params0: θ₀, the init and the centre of g.
    x_train: (N, ...) training inputs X.
    labels: (N,) regression targets, e.g. Θ̂(X, x_t).
    num_steps: gradient steps (static).
    learning_rate: step size η; None picks 1/λ_max(Θ̂(X, X)) at θ₀ (power iteration).

  Returns:
    θ after ``num_steps`` steps; predict with ``single_query_predict(apply_fn, θ, θ₀, x)``.
  """
  chex.assert_rank(labels, 1)
  chex.assert_axis_dimension(labels, 0, x_train.shape[0])
  if learning_rate is None:
    learning_rate = 1.0 / _gram_lambda_max(apply_fn, params0, x_train)

  def loss_fn(p):
    r = single_query_predict(apply_fn, p, params0, x_train) - labels
    return 0.5 * jnp.sum(r * r)

  grad_fn = jax.grad(loss_fn)

  def step(_, p):
    g = grad_fn(p)
    return jax.tree_util.tree_map(lambda a, b: a - learning_rate * b, p, g)

  return jax.lax.fori_loop(0, num_steps, step, params0)
