"""Networks built from one spec: the flax.linen net and its neural-tangents kernel.

A spec (``MLPSpec`` or ``CNNSpec``) is the single source of an architecture:
``module(spec)`` builds the flax net, ``stax_layers(spec)`` the matching
``neural_tangents.stax`` triple, so the finite net and its infinite-width kernel cannot
drift apart. Both use the same parameterisation:

* ``"ntk"`` (Jacot et al. 2018): weights and biases are N(0, 1) and the layer computes
  ``y = w_std / sqrt(fan_in) * x @ W + b_std * b``. Its NTK has a finite, deterministic
  infinite-width limit, which is what the CSD theory is about.
* ``"standard"``: ``W ~ N(0, w_std² / fan_in)``, ``b ~ N(0, b_std²)``, ``y = x @ W + b``.
  Same function distribution at init; its NTK grows with width (neural-tangents scales it
  by the layer widths).

Every net exposes ``features(x)`` (the penultimate activations ϕ(x)) besides
``__call__(x)``; ``last_layer_features`` turns them into the features whose inner
product is the last-layer NTK Θ_L (docs/design.md §1).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Sequence

import chex
import flax
import flax.linen as nn
import jax
import jax.numpy as jnp

from csd_jax import _nt_compat

Array = jax.Array
PyTree = Any

_ACTIVATIONS = {"relu": jax.nn.relu, "erf": jax.scipy.special.erf}
_PARAMETERIZATIONS = ("ntk", "standard")


def _check_common(
    activation: str,
    parameterization: str,
    out_dim: int,
    dropout_rate: float,
    spectral_norm: float | None = None,
) -> None:
  if spectral_norm is not None and not spectral_norm > 0:
    raise ValueError(f"spectral_norm must be positive or None, got {spectral_norm}")
  if spectral_norm is not None and parameterization != "standard":
    raise ValueError(
        "spectral_norm needs parameterization='standard' (the bound is on the weights the "
        f"layer multiplies by), got {parameterization!r}"
    )
  if activation not in _ACTIVATIONS:
    raise ValueError(f"activation must be one of {sorted(_ACTIVATIONS)}, got {activation!r}")
  if parameterization not in _PARAMETERIZATIONS:
    raise ValueError(
        f"parameterization must be one of {_PARAMETERIZATIONS}, got {parameterization!r}"
    )
  if out_dim < 1:
    raise ValueError(f"out_dim must be positive, got {out_dim}")
  if not 0.0 <= dropout_rate < 1.0:
    raise ValueError(f"dropout_rate must be in [0, 1), got {dropout_rate}")


@dataclasses.dataclass(frozen=True)
class MLPSpec:
  """A fully connected net: ``len(widths)`` hidden layers, then a linear head.

  Attributes:
    widths: hidden layer widths.
    out_dim: output dimension of the head.
    activation: ``"relu"`` or ``"erf"``.
    w_std, b_std: weight / bias scales (σ_w, σ_b); ``b_std=None`` means no bias.
    parameterization: ``"ntk"`` or ``"standard"`` (module docstring).
    dropout_rate: dropout after each hidden activation (MC dropout); 0 disables it.
      Infinite-width kernels ignore dropout.
    one_hot_blocks: a promise that every input row is a concatenation of one-hot (or all-zero)
      blocks of these sizes, e.g. (N², 2) for DeepSea's grid and an action. The first layer then
      gathers the kernel row of each block's hot entry instead of multiplying (``one_hot_matmul``):
      the same function and params at a cost independent of the input width. Rows that break
      the promise give wrong outputs, not an error. Empty: the dense product. Kernels ignore it.
    spectral_norm: c > 0: every hidden layer (not the head) multiplies by c·W/σ(W), so its
      weights' spectral norm is c (Miyato et al. 2018, as SNGP and DDU use for
      distance-aware towers). σ is flax's ``nn.SpectralNorm`` estimate: one power-iteration step
      per forward pass from a stored vector u in the ``batch_stats`` collection, which a call
      with ``update_stats=True`` and ``mutable=["batch_stats"]`` advances. A conv's bound is on
      its kernel reshaped to (k·k·C_in, C_out), the map from one patch to one output pixel; the
      conv as a whole is then at most ⌈k/stride⌉·c-Lipschitz (each input pixel lies in at most
      ⌈k/stride⌉² patches). ReLU and erf are 1-Lipschitz, so the features ϕ(x) are Lipschitz
      with at most the product of the hidden layers' bounds (c^L for an MLP of L hidden
      layers). None: off.
      Standard parameterisation only; no infinite-width kernel (``stax_layers`` refuses it).
    residual: every hidden layer whose output has its input's shape adds its input,
      h ← h + act(layer(h)) (the residual blocks of SNGP and DDU: with ``spectral_norm`` c < 1
      such a block is bi-Lipschitz, (1 − c)‖x − y‖ ≤ ‖h(x) − h(y)‖ ≤ (1 + c)‖x − y‖). Layers
      that change the shape stay plain. No infinite-width kernel.
  """

  widths: tuple[int, ...] = (512, 512)
  out_dim: int = 1
  activation: str = "relu"
  w_std: float = math.sqrt(2.0)
  b_std: float | None = 0.1
  parameterization: str = "ntk"
  dropout_rate: float = 0.0
  one_hot_blocks: tuple[int, ...] = ()
  spectral_norm: float | None = None
  residual: bool = False

  def __post_init__(self):
    if not self.widths or any(w < 1 for w in self.widths):
      raise ValueError(f"widths must be a non-empty tuple of positive ints, got {self.widths}")
    object.__setattr__(self, "one_hot_blocks", tuple(int(b) for b in self.one_hot_blocks))
    if any(b < 1 for b in self.one_hot_blocks):
      raise ValueError(f"one_hot_blocks must be positive sizes, got {self.one_hot_blocks}")
    _check_common(
        self.activation,
        self.parameterization,
        self.out_dim,
        self.dropout_rate,
        self.spectral_norm,
    )


@dataclasses.dataclass(frozen=True)
class CNNSpec:
  """Convolutions (NHWC), flatten, fully connected layers, linear head.

  Attributes:
    convs: ``(channels, kernel_size, stride)`` per conv layer; square kernels.
    padding: ``"SAME"`` or ``"VALID"``.
    widths: hidden widths of the dense layers after flattening (may be empty).
    Other attributes as in ``MLPSpec``.
  """

  convs: tuple[tuple[int, int, int], ...] = ((32, 3, 1), (32, 3, 2))
  widths: tuple[int, ...] = (256,)
  out_dim: int = 10
  padding: str = "SAME"
  activation: str = "relu"
  w_std: float = math.sqrt(2.0)
  b_std: float | None = 0.1
  parameterization: str = "ntk"
  dropout_rate: float = 0.0
  spectral_norm: float | None = None
  residual: bool = False

  def __post_init__(self):
    if not self.convs:
      raise ValueError("convs must be non-empty; use MLPSpec for a net without convolutions")
    if any(min(c) < 1 for c in self.convs):
      raise ValueError(f"conv (channels, kernel, stride) must be positive, got {self.convs}")
    if self.padding not in ("SAME", "VALID"):
      raise ValueError(f"padding must be 'SAME' or 'VALID', got {self.padding!r}")
    if any(w < 1 for w in self.widths):
      raise ValueError(f"widths must be positive, got {self.widths}")
    _check_common(
        self.activation,
        self.parameterization,
        self.out_dim,
        self.dropout_rate,
        self.spectral_norm,
    )


Spec = MLPSpec | CNNSpec
# A net CSD can use: a spec (which also gives the exact neural-tangents kernels) or any flax
# module of the user's own (``is_spec`` tells them apart; module docstrings say what its
# output means where it is used).
Net = Spec | nn.Module


def is_spec(net: Net) -> bool:
  """True for the project's specs, False for a user's ``flax.linen.Module``."""
  if isinstance(net, (MLPSpec, CNNSpec)):
    return True
  if isinstance(net, nn.Module):
    return False
  raise TypeError(
      f"expected an MLPSpec, a CNNSpec or a flax.linen.Module, got " f"{type(net).__name__}"
  )


NATURE_DQN_TORSO = CNNSpec(
    convs=((32, 8, 4), (64, 4, 2), (64, 3, 1)), widths=(512,), padding="VALID", out_dim=1
)
"""The Nature-DQN torso (Mnih et al. 2015) as a spec, for 84×84 pixel observations."""


@flax.struct.dataclass
class OneHotProduct:
  """The inputs [x_b, one_hot(a, num)] of every row b of ``x`` (B, D) and every a < num, in row
  order b * num + a, not materialised: (B * num, D + num) inputs. A net's first dense layer
  computes them as x_b W[:D] + W[D + a], one product per row of ``x`` instead of per input,
  with the same params as on the materialised inputs (``as_array``). MLPs only."""

  x: Array
  num: int = flax.struct.field(pytree_node=False)

  @property
  def shape(self) -> tuple[int, int]:
    return (self.x.shape[0] * self.num, self.x.shape[1] + self.num)

  @property
  def dtype(self):
    return self.x.dtype


def as_array(x: Array | OneHotProduct) -> Array:
  """``x`` itself, or the inputs a ``OneHotProduct`` stands for: (B * num, D + num)."""
  if not isinstance(x, OneHotProduct):
    return x
  rep = jnp.repeat(x.x, x.num, axis=0)
  onehot = jnp.tile(jnp.eye(x.num, dtype=x.x.dtype), (x.x.shape[0], 1))
  return jnp.concatenate([rep, onehot], axis=-1)


def one_hot_matmul(x: Array, w: Array, blocks: tuple[int, ...]) -> Array:
  """``x @ w`` for rows ``x`` (B, D) made of one-hot or all-zero blocks of sizes ``blocks``
  (summing to D): per block, the row of ``w`` (D, H) at its hot entry, times that entry (1, or 0
  for a zero block). Bitwise the same values as the product, whose sum has one nonzero term per
  block, at O(B·H) per block instead of O(B·D·H); ``blocks`` empty: the product."""
  if not blocks:
    return x @ w
  if sum(blocks) != x.shape[-1]:
    raise ValueError(
        f"one_hot_blocks {blocks} sum to {sum(blocks)}, but the inputs have "
        f"{x.shape[-1]} features"
    )
  y, start = 0.0, 0
  for size in blocks:
    part = x[:, start : start + size]
    hot = jnp.take(w, start + jnp.argmax(part, axis=-1), axis=0)
    y = y + hot * jnp.max(part, axis=-1, keepdims=True)
    start += size
  return y


class _Affine(nn.Module):
  """Dense or conv layer in NTK or standard parameterisation (module docstring)."""

  features: int
  w_std: float
  b_std: float | None
  parameterization: str
  kernel_size: int | None = None  # None: dense; else a square conv kernel
  stride: int = 1
  padding: str = "SAME"
  one_hot_blocks: tuple[int, ...] = ()  # dense only: MLPSpec.one_hot_blocks
  kernel_scale: float = 1.0  # standard only: y = kernel_scale · x @ W + b (spectral_norm's c)

  @nn.compact
  def __call__(self, x: Array | OneHotProduct) -> Array:
    conv = self.kernel_size is not None
    product = isinstance(x, OneHotProduct)
    if conv and product:
      raise ValueError(
          "a OneHotProduct input needs an MLP (its first layer dense), not a " "conv net"
      )
    k = self.kernel_size or 1
    fan_in = x.shape[-1] * k * k
    ntk = self.parameterization == "ntk"
    w_init_std = 1.0 if ntk else self.w_std / math.sqrt(fan_in)
    shape = (k, k, x.shape[-1], self.features) if conv else (x.shape[-1], self.features)
    w = self.param("kernel", nn.initializers.normal(w_init_std), shape, x.dtype)
    if conv:
      y = jax.lax.conv_general_dilated(
          x, w, (self.stride, self.stride), self.padding, dimension_numbers=("NHWC", "HWIO", "NHWC")
      )
    elif product:  # [x_b, e_a] @ W = x_b @ W[:D] + W[D + a]
      d = x.x.shape[-1]
      blocks = self.one_hot_blocks
      if blocks and blocks[-1] != x.num:
        raise ValueError(
            f"the last of one_hot_blocks {blocks} must be the OneHotProduct's " f"{x.num} actions"
        )
      xw = one_hot_matmul(x.x, w[:d], blocks[:-1])
      y = (xw[:, None, :] + w[d:][None]).reshape((-1, self.features))
    else:
      y = one_hot_matmul(x, w, self.one_hot_blocks)
    if ntk:
      y = y * (self.w_std / math.sqrt(fan_in))
    elif self.kernel_scale != 1.0:
      y = y * self.kernel_scale
    if self.b_std is not None:
      b_init_std = 1.0 if ntk else self.b_std
      b = self.param("bias", nn.initializers.normal(b_init_std), (self.features,), x.dtype)
      y = y + (self.b_std * b if ntk else b)
    return y


class SpecNet(nn.Module):
  """The flax net of a spec. ``features`` gives ϕ(x), ``__call__`` the head's output.

  Inputs: (B, D) for an MLP (or a ``OneHotProduct`` standing for them), (B, H, W, C) for a
  CNN. Outputs: (B, out_dim).
  """

  spec: Spec

  def setup(self):
    s = self.spec
    common = dict(w_std=s.w_std, b_std=s.b_std, parameterization=s.parameterization)
    sn = s.spectral_norm
    hidden = dict(common, kernel_scale=1.0 if sn is None else sn)
    # Hidden layers only: the head stays free (SNGP and DDU leave the output layer alone).
    wrap = (lambda layer: layer) if sn is None else nn.SpectralNorm
    convs = getattr(s, "convs", ())
    self.conv_layers = [
        wrap(_Affine(ch, kernel_size=k, stride=st, padding=s.padding, **hidden))
        for ch, k, st in convs
    ]
    # The first layer of an MLP sees the raw inputs, so only it can use their one-hot blocks.
    first_blocks = () if convs else getattr(s, "one_hot_blocks", ())
    self.dense_layers = [
        wrap(_Affine(w, one_hot_blocks=first_blocks if i == 0 else (), **hidden))
        for i, w in enumerate(s.widths)
    ]
    self.head = _Affine(s.out_dim, **common)
    self.dropout = nn.Dropout(s.dropout_rate)

  def _hidden(self, layer, x: Array, deterministic: bool, update_stats: bool) -> Array:
    """act(layer(x)), plus x when ``residual`` and the shapes agree, then dropout."""
    kw = {} if self.spec.spectral_norm is None else {"update_stats": update_stats}
    h = _ACTIVATIONS[self.spec.activation](layer(x, **kw))
    if self.spec.residual and h.shape == x.shape:
      h = h + x
    return self.dropout(h, deterministic=deterministic)

  def features(self, x: Array, deterministic: bool = True, update_stats: bool = False) -> Array:
    """Penultimate activations ϕ(x): (B, n) with n the last hidden width. ``update_stats``:
    store ``spectral_norm``'s advanced power-iteration vectors (needs
    ``mutable=["batch_stats"]``)."""
    for layer in self.conv_layers:
      x = self._hidden(layer, x, deterministic, update_stats)
    if self.conv_layers:
      x = x.reshape((x.shape[0], -1))
    for layer in self.dense_layers:
      x = self._hidden(layer, x, deterministic, update_stats)
    return x

  def __call__(self, x: Array, deterministic: bool = True, update_stats: bool = False) -> Array:
    return self.head(self.features(x, deterministic, update_stats))


def module(spec: Net) -> nn.Module:
  """The flax.linen net of ``spec`` (a user's module is returned as it is)."""
  return SpecNet(spec) if is_spec(spec) else spec


def stax_layers(spec: Spec):
  """The ``neural_tangents.stax`` ``(init_fn, apply_fn, kernel_fn)`` of ``spec``.

  Same layers, scales and parameterisation as ``module(spec)``; dropout is left out
  (the kernels are those of the deterministic net).
  """
  if spec.spectral_norm is not None or spec.residual:
    raise ValueError(
        "no infinite-width kernel is built for spectral_norm or residual nets; "
        f"got spectral_norm={spec.spectral_norm}, residual={spec.residual}"
    )
  stax = _nt_compat.nt().stax
  act = {"relu": stax.Relu, "erf": stax.Erf}[spec.activation]
  common = dict(W_std=spec.w_std, b_std=spec.b_std, parameterization=spec.parameterization)
  layers = []
  for ch, k, st in getattr(spec, "convs", ()):
    layers += [stax.Conv(ch, (k, k), (st, st), padding=spec.padding, **common), act()]
  if isinstance(spec, CNNSpec):
    layers.append(stax.Flatten())
  for w in spec.widths:
    layers += [stax.Dense(w, **common), act()]
  layers.append(stax.Dense(spec.out_dim, **common))
  return stax.serial(*layers)


def feature_width(spec: Spec, input_shape: Sequence[int]) -> int:
  """n, the width of ϕ(x) for inputs of ``input_shape`` (without the batch axis)."""
  shape = jax.eval_shape(
      lambda: module(spec).init_with_output(
          jax.random.PRNGKey(0), jnp.zeros((1, *input_shape)), method=SpecNet.features
      )[0]
  )
  return int(shape.shape[-1])


def last_layer_features(spec: Net, params: PyTree, x: Array) -> Array:
  """Features whose inner products are the last-layer NTK: Θ_L(x, c) = ϕ̃(x)·ϕ̃(c).

  Θ_L is the NTK restricted to the head's parameters (docs/design.md §1). For a head
  ``y = σ_w/√n ϕ(x)ᵀW + σ_b b`` (NTK parameterisation) its gradients give
  ``Θ_L(x, c) = σ_w²/n ϕ(x)ᵀϕ(c) + σ_b²``; for the standard parameterisation
  ``ϕ(x)ᵀϕ(c) + 1``. So ϕ̃ = [scaled ϕ, constant], the constant absent without a bias.

  A user's flax module (not a spec) is taken to output ϕ̃ itself: its output is returned.

  Args:
    spec: the net's spec, or a flax module whose output is ϕ̃.
    params: its flax params (``{"params": ...}``).
    x: inputs, (B, ...) as for the net.

  Returns:
    ϕ̃(x): (B, n + 1), or (B, n) when the head has no bias.
  """
  if not is_spec(spec):
    phi = spec.apply(params, x)
    chex.assert_rank(phi, 2)
    return phi
  phi = module(spec).apply(params, x, method=SpecNet.features)
  chex.assert_rank(phi, 2)
  if spec.parameterization == "ntk":
    phi = phi * (spec.w_std / math.sqrt(phi.shape[-1]))
    bias = spec.b_std
  else:
    bias = 1.0
  if spec.b_std is None:
    return phi
  return jnp.concatenate([phi, jnp.full((phi.shape[0], 1), bias, phi.dtype)], axis=-1)


@functools.partial(jax.jit, static_argnums=0)
def _last_layer_features_jit(spec: Net, params: PyTree, x: Array) -> Array:
  return last_layer_features(spec, params, x)


def batched_last_layer_features(
    spec: Net, params: PyTree, x: Array, *, batch_size: int = 1024
) -> Array:
  """``last_layer_features`` of many inputs, ``batch_size`` at a time (one jitted call per
  chunk): (M, n + 1)."""
  return jnp.concatenate(
      [
          _last_layer_features_jit(spec, params, x[i : i + batch_size])
          for i in range(0, x.shape[0], batch_size)
      ]
  )
