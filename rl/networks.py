"""Q-networks and observation preprocessing for the DQN agents (``rl.dqn``).

Every net here is built from a ``csd_jax.models`` spec, so the Q-network torso, the CSD
prior torso and the RND nets are the same architecture family:

* pixels (VizDoom): uint8 (B, C, H, W) NCHW frame stacks -> float32 /255, NHWC (B, H, W, C),
  then a conv net (``conv_spec``; the settings of ``configs/vizdoom.py`` give its layers);
* vectors (DeepSea): float32 (B, D) -> an MLP (``mlp_spec``);
* the paper's VizDoom Q-net: ``ImpalaSpec``, IMPALA's residual stages (a Q-net only),
  optionally with spectrally normalised dense layers (``refresh_spectral_norm``).

``QNetwork`` returns Q-values of shape (B, K, A) for K heads (K = 1 for DQN). Heads either share
one torso (one spec net with a K*A head; the cheap choice for pixels) or are K independent nets
(``nn.vmap`` over the spec net: the ensemble of Osband et al. 2018, used for DeepSea). The
additive randomised prior of BDQN+P is the *same* module applied to a second, frozen parameter
set: ``Q(s) = Q_θ(s) + β Q_prior(s)`` (``rl.dqn``).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from csd_jax import models

Array = jax.Array


def preprocess(obs: Array) -> Array:
  """Raw env observations -> the float network input.

  (B, C, H, W) uint8 pixels -> (B, H, W, C) float32 in [0, 1]; any other rank -> float32 as is
  (DeepSea's one-hot grid, stored as uint8 0/1 in replay).
  """
  if obs.ndim == 4:
    return jnp.transpose(obs.astype(jnp.float32) / 255.0, (0, 2, 3, 1))
  return obs.astype(jnp.float32)


def conv_spec(
    convs, padding: str, widths, out_dim: int, parameterization: str = "standard"
) -> models.Spec:
  """A ReLU net of ``convs`` ((channels, kernel, stride) each) then dense ``widths`` and a linear
  head of ``out_dim``, He-scaled weights; an MLP (``mlp_spec``) when ``convs`` is empty.
  Standard parameterisation by default: the nets are trained with Adam, for which NTK scaling
  only shrinks the effective step."""
  convs = tuple(tuple(int(v) for v in c) for c in convs)
  widths = tuple(int(w) for w in widths)
  if not convs:
    return mlp_spec(widths, out_dim, parameterization)
  return models.CNNSpec(
      convs=convs,
      widths=widths,
      padding=padding,
      out_dim=out_dim,
      parameterization=parameterization,
  )


def mlp_spec(
    widths: tuple[int, ...],
    out_dim: int,
    parameterization: str = "standard",
    one_hot_blocks: tuple[int, ...] = (),
) -> models.MLPSpec:
  """A ReLU MLP, He-scaled weights (σ_w = √2), small biases; ``one_hot_blocks``: its inputs'
  one-hot blocks (``models.MLPSpec``), which its first layer then gathers."""
  return models.MLPSpec(
      widths=tuple(widths),
      out_dim=out_dim,
      w_std=math.sqrt(2.0),
      b_std=0.1,
      parameterization=parameterization,
      one_hot_blocks=one_hot_blocks,
  )


@dataclasses.dataclass(frozen=True)
class ImpalaSpec:
  """The IMPALA-CNN Q-net (Espeholt et al. 2018): per entry of ``channels`` a 3x3 conv, a 3x3
  max-pool of stride 2 and two residual blocks (ReLU, 3x3 conv, ReLU, 3x3 conv, + input); then
  ReLU, flatten, ReLU dense ``widths`` and a linear head of ``out_dim``. He-uniform weights,
  zero biases (the CSD paper's VizDoom init). A Q-net only: it has no NTK (``csd_jax.models``
  specs are the nets whose kernels are used).

  ``spectral_norm``: the hidden dense layers divide their kernel by its largest singular value
  (Miyato et al. 2018; flax ``nn.SpectralNorm``, one power-iteration step per forward pass from
  the stored vector u, kept in the ``batch_stats`` collection and advanced by
  ``refresh_spectral_norm``). The paper names spectral normalisation without saying which
  layers; with one hidden dense layer this is the penultimate layer, the single layer that
  Gogianu et al. (2021) normalised in C51."""

  channels: tuple[int, ...] = (32, 32, 64)
  widths: tuple[int, ...] = (256,)
  out_dim: int = 1
  spectral_norm: bool = False

  def __post_init__(self):
    if not self.channels or min(self.channels) < 1 or min(self.widths, default=1) < 1:
      raise ValueError(
          f"channels must be non-empty and positive and widths positive, got "
          f"{self.channels}, {self.widths}"
      )


class ImpalaNet(nn.Module):
  """``ImpalaSpec``'s net: (B, H, W, C) -> (B, out_dim)."""

  spec: ImpalaSpec

  @nn.compact
  def __call__(self, x: Array, update_stats: bool = False) -> Array:
    """``update_stats``: store the power iteration's u (``spectral_norm``)."""
    conv = lambda c: nn.Conv(c, (3, 3), padding="SAME", kernel_init=nn.initializers.he_uniform())
    for c in self.spec.channels:
      x = nn.max_pool(conv(c)(x), (3, 3), strides=(2, 2), padding="SAME")
      for _ in range(2):
        x = x + conv(c)(nn.relu(conv(c)(nn.relu(x))))
    x = nn.relu(x).reshape((x.shape[0], -1))
    for w in self.spec.widths:
      dense = nn.Dense(w, kernel_init=nn.initializers.he_uniform())
      if self.spec.spectral_norm:
        dense = functools.partial(nn.SpectralNorm(dense), update_stats=update_stats)
      x = nn.relu(dense(x))
    return nn.Dense(self.spec.out_dim, kernel_init=nn.initializers.he_uniform())(x)


def _net_class(spec) -> type[nn.Module]:
  return ImpalaNet if isinstance(spec, ImpalaSpec) else models.SpecNet


class QNetwork(nn.Module):
  """Q-values (B, K, A) of K heads.

  Attributes:
    spec: the net's spec (a ``csd_jax.models`` spec or an ``ImpalaSpec``; torso + head); its
      ``out_dim`` is replaced.
    num_actions: A.
    num_heads: K.
    shared_torso: True: one torso, a K*A head; False: K independent nets (``nn.vmap``).
    num_atoms: N > 1: each Q-value is a categorical distribution (C51): the logits of its N
      atoms, (B, K, A, N).
    extra_outputs: E > 0: a second linear head of E outputs on the same torso (the
      state-action agents' intrinsic values, ``rl.dqn``), read with ``with_extra``.
  """

  spec: models.Spec | ImpalaSpec
  num_actions: int
  num_heads: int = 1
  shared_torso: bool = True
  num_atoms: int = 1
  extra_outputs: int = 0

  @nn.compact
  def __call__(
      self, x: Array, update_stats: bool = False, with_extra: bool = False
  ) -> Array | tuple[Array, Array]:
    """x: preprocessed observations (B, ...) -> (B, K, A), or (B, K, A, N) logits; with
    ``with_extra`` also the extra head's (B, E) (computed in the same pass).
    ``update_stats``: advance spectral normalisation's power iteration (``ImpalaSpec``)."""
    k, a, n, e = self.num_heads, self.num_actions, self.num_atoms, self.extra_outputs
    shape = (x.shape[0], k, a) + ((n,) if n > 1 else ())
    spectral = getattr(self.spec, "spectral_norm", False)
    if with_extra and not e:
      raise ValueError("with_extra needs extra_outputs > 0")
    if self.shared_torso or k == 1:
      net = _net_class(self.spec)(dataclasses.replace(self.spec, out_dim=k * a * n + e), name="net")
      out = net(x, update_stats=update_stats) if spectral else net(x)
      main = out[:, : k * a * n].reshape(shape)
      return (main, out[:, k * a * n :]) if with_extra else main
    if e:
      raise ValueError("extra_outputs needs one shared torso (shared_torso or one head)")
    if spectral:
      raise ValueError("spectral_norm needs one shared torso (shared_torso or one head)")
    ensemble = nn.vmap(
        _net_class(self.spec),
        variable_axes={"params": 0},
        split_rngs={"params": True},
        in_axes=None,
        out_axes=1,
        axis_size=k,
    )
    net = ensemble(dataclasses.replace(self.spec, out_dim=a * n), name="ensemble")
    return net(x).reshape(shape)


def refresh_spectral_norm(net: QNetwork, variables: dict, x: Array) -> dict:
  """``variables`` with spectral normalisation's stored power-iteration vectors advanced one
  step (the kernels' current singular vectors); as given when ``net`` has none. ``x``: any
  input batch (the iteration does not depend on it; one row is enough)."""
  if not getattr(net.spec, "spectral_norm", False):
    return variables
  _, stats = net.apply(variables, x[:1], update_stats=True, mutable=["batch_stats"])
  return {**variables, **stats}
