"""JAX-native image augmentations for CSD-Aug.

CSD-Aug draws its contexts c from augmentations of the training images, in the spirit of the
augmentations of contrastive learning; they need not preserve labels.

Conventions, for every function here:
  * images: float32 array (B, H, W, C), NHWC, values in [0, 1]; outputs have the same shape and
    dtype and are clipped to [0, 1].
  * Random augmentations have the signature ``fn(key, images) -> images``; extra magnitudes are
    keyword arguments and may be traced (so ``jax.jit`` over them works, unless a docstring says a
    parameter is static). Parameters are drawn per image.
  * Deterministic primitives (``translate``, ``rotate``, ``warp``, ``gaussian_blur``,
    ``adjust_contrast``, ``adjust_brightness``, ``scale_brightness``, ``erase``) take explicit
    per-image parameters; the random augmentations and ``uncertainty_kit.data.perturbed`` are built on
    them.
  * Resampling is bilinear with zero fill outside the image (MNIST-like backgrounds are 0).
  * The deterministic primitives are jitted (so eager callers such as ``uncertainty_kit.data`` run one
    compiled program per shape, not one per primitive op); inside a caller's jit they inline.
"""

from __future__ import annotations

import functools
import math
from typing import Callable

import chex
import jax
import jax.numpy as jnp
from jax.scipy import ndimage

from uncertainty_kit import defaults

Augmentation = Callable[[chex.PRNGKey, chex.Array], chex.Array]


def _check_images(images: chex.Array) -> None:
  chex.assert_rank(images, 4)
  chex.assert_type(images, jnp.float32)


def _clip(images: chex.Array) -> chex.Array:
  return jnp.clip(images, 0.0, 1.0)


def _per_image(values: chex.Array, batch: int) -> chex.Array:
  """Broadcasts a scalar or (B,) parameter to shape (B,) float32."""
  return jnp.broadcast_to(jnp.asarray(values, jnp.float32), (batch,))


# ----------------------------------------------------------------------------------------------
# Deterministic primitives.
# ----------------------------------------------------------------------------------------------


@jax.jit
def warp(images: chex.Array, rows: chex.Array, cols: chex.Array) -> chex.Array:
  """Resamples each image at given (fractional) pixel coordinates, bilinearly, zero outside.

  Args:
    images: (B, H, W, C) float32.
    rows, cols: (B, H, W) float32, the input-pixel coordinates (row, column, in pixels) that each
      output pixel reads from; all channels share them.

  Returns:
    (B, H, W, C) float32 in [0, 1].
  """
  _check_images(images)
  chex.assert_shape([rows, cols], images.shape[:3])

  def one_channel(image, r, c):  # image (H, W), r, c (H, W)
    return ndimage.map_coordinates(image, [r, c], order=1, mode="constant", cval=0.0)

  # vmap over channels (shared coordinates), then over the batch.
  per_image = jax.vmap(one_channel, in_axes=(2, None, None), out_axes=2)
  return _clip(jax.vmap(per_image)(images, rows, cols))


# Coordinate maps. A warp reads each output pixel from input coordinates (rows, cols), each
# (B, H, W); a map below turns the coordinates of its output into those of its input, so a chain
# of geometric transforms is a chain of maps applied last-transform-first, then a single warp.


def _grid(images: chex.Array) -> tuple[chex.Array, chex.Array]:
  """The identity map: row and column indices, each (B, H, W) float32."""
  b, h, w = images.shape[:3]
  r, c = jnp.meshgrid(
      jnp.arange(h, dtype=jnp.float32), jnp.arange(w, dtype=jnp.float32), indexing="ij"
  )
  return jnp.broadcast_to(r, (b, h, w)), jnp.broadcast_to(c, (b, h, w))


def _shift_map(rows, cols, shifts):
  """Inverse of moving content by shifts (B, 2) = (down, right) pixels."""
  return rows - shifts[:, 0, None, None], cols - shifts[:, 1, None, None]


def _rotation_map(rows, cols, angles):
  """Inverse of a counter-clockwise (as displayed) rotation by angles (B,) radians about the
  image centre."""
  h, w = rows.shape[1:]
  cy, cx = (h - 1) / 2.0, (w - 1) / 2.0
  y, x = rows - cy, cols - cx  # y points down
  cos, sin = jnp.cos(angles)[:, None, None], jnp.sin(angles)[:, None, None]
  return cy + x * sin + y * cos, cx + x * cos - y * sin


def _displacement_map(rows, cols, field):
  """Each output pixel reads from its own position plus field (B, H, W, 2) pixels."""
  return rows + field[..., 0], cols + field[..., 1]


def _homography(start: chex.Array, end: chex.Array) -> chex.Array:
  """(B, 3, 3) projective maps H with H(end_k) = start_k for the four (x, y) = (col, row) points
  start, end (B, 4, 2): an output pixel at ``end_k`` reads the input at ``start_k``."""
  x, y = end[..., 0], end[..., 1]
  u, v = start[..., 0], start[..., 1]
  one, zero = jnp.ones_like(x), jnp.zeros_like(x)
  # u (g x + h y + 1) = a x + b y + c and v (g x + h y + 1) = d x + e y + f, per point.
  rows_u = jnp.stack([x, y, one, zero, zero, zero, -x * u, -y * u], axis=-1)
  rows_v = jnp.stack([zero, zero, zero, x, y, one, -x * v, -y * v], axis=-1)
  a = jnp.concatenate([rows_u, rows_v], axis=1)  # (B, 8, 8)
  coef = jnp.linalg.solve(a, jnp.concatenate([u, v], axis=1)[..., None])[..., 0]
  return jnp.concatenate([coef, jnp.ones_like(coef[:, :1])], axis=1).reshape(-1, 3, 3)


def _perspective_map(rows, cols, end):
  """Inverse of the perspective warp that moves the image corners (``_corners``) to ``end``
  (B, 4, 2), as (x, y) = (col, row) pixels; rows, cols: (B, H, W)."""
  h, w = rows.shape[1:]
  m = _homography(jnp.broadcast_to(_corners(h, w), end.shape), end)[:, :, :, None, None]
  den = m[:, 2, 0] * cols + m[:, 2, 1] * rows + m[:, 2, 2]
  return (
      (m[:, 1, 0] * cols + m[:, 1, 1] * rows + m[:, 1, 2]) / den,
      (m[:, 0, 0] * cols + m[:, 0, 1] * rows + m[:, 0, 2]) / den,
  )


def _corners(h: int, w: int) -> jnp.ndarray:
  """(4, 2) image corners as (x, y): top-left, top-right, bottom-right, bottom-left."""
  return jnp.array([[0, 0], [w - 1, 0], [w - 1, h - 1], [0, h - 1]], jnp.float32)


@jax.jit
def perspective(images: chex.Array, endpoints: chex.Array) -> chex.Array:
  """Perspective warp that moves the four image corners to ``endpoints``.

  torchvision's ``F.perspective(img, corners, endpoints)``: the content at each corner
  (top-left, top-right, bottom-right, bottom-left) moves to the matching endpoint, and lines
  stay lines.

  Args:
    images: (B, H, W, C) float32.
    endpoints: (B, 4, 2) or (4, 2), (x, y) = (column, row) pixels, in corner order.

  Returns:
    (B, H, W, C) float32 in [0, 1].
  """
  _check_images(images)
  end = jnp.broadcast_to(jnp.asarray(endpoints, jnp.float32), (images.shape[0], 4, 2))
  return warp(images, *_perspective_map(*_grid(images), end))


def _perspective_endpoints(key, batch, h, w, distortion):
  """(batch, 4, 2) corners each moved inward by U[0, distortion · half side] per axis
  (torchvision ``RandomPerspective``, continuous instead of integer offsets)."""
  inward = (
      jax.random.uniform(key, (batch, 4, 2))
      * distortion
      * jnp.array([(w - 1) / 2.0, (h - 1) / 2.0], jnp.float32)
  )
  toward_centre = jnp.array([[1, 1], [-1, 1], [-1, -1], [1, -1]], jnp.float32)
  return _corners(h, w) + toward_centre * inward


@jax.jit
def translate(images: chex.Array, shifts: chex.Array) -> chex.Array:
  """Moves the content of each image by ``shifts`` pixels, filling with zeros.

  Integer shifts are exact (the same as pad-and-crop); fractional shifts interpolate bilinearly.

  Args:
    images: (B, H, W, C) float32.
    shifts: (B, 2) or (2,) float, (down, right) in pixels: content at (r, c) moves to
      (r + shifts[0], c + shifts[1]).

  Returns:
    (B, H, W, C) float32 in [0, 1].
  """
  _check_images(images)
  shifts = jnp.broadcast_to(jnp.asarray(shifts, jnp.float32), (images.shape[0], 2))
  return warp(images, *_shift_map(*_grid(images), shifts))


@jax.jit
def rotate(images: chex.Array, angles: chex.Array) -> chex.Array:
  """Rotates each image about its centre, counter-clockwise as displayed (row axis downward).

  ``rotate(x, pi / 2)`` equals ``np.rot90(x, axes=(1, 2))`` up to float rounding.

  Args:
    images: (B, H, W, C) float32.
    angles: (B,) or scalar, radians.

  Returns:
    (B, H, W, C) float32 in [0, 1].
  """
  _check_images(images)
  return warp(images, *_rotation_map(*_grid(images), _per_image(angles, images.shape[0])))


def _gaussian_kernel(sigma: float) -> jnp.ndarray:
  radius = max(1, int(math.ceil(3.0 * sigma)))
  t = jnp.arange(-radius, radius + 1, dtype=jnp.float32)
  kernel = jnp.exp(-0.5 * (t / sigma) ** 2)
  return kernel / kernel.sum()


def _blur(x: chex.Array, sigma: float) -> chex.Array:
  """Separable Gaussian filter of a (B, H, W, C) array, zero padding, no clipping."""
  if sigma <= 0:
    return x
  kernel = _gaussian_kernel(sigma)
  channels = x.shape[-1]
  k = kernel.shape[0]
  dn = ("NHWC", "HWIO", "NHWC")
  # Depthwise convolutions: one (k, 1) pass along rows, one (1, k) pass along columns.
  k_rows = jnp.tile(kernel.reshape(k, 1, 1, 1), (1, 1, 1, channels))
  k_cols = jnp.tile(kernel.reshape(1, k, 1, 1), (1, 1, 1, channels))
  conv = functools.partial(
      jax.lax.conv_general_dilated,
      window_strides=(1, 1),
      padding="SAME",
      dimension_numbers=dn,
      feature_group_count=channels,
  )
  return conv(conv(x, k_rows), k_cols)


@functools.partial(jax.jit, static_argnames="sigma")
def gaussian_blur(images: chex.Array, sigma: float) -> chex.Array:
  """Gaussian blur with standard deviation ``sigma`` pixels (static Python float; 0 = identity).

  Args:
    images: (B, H, W, C) float32.
    sigma: pixels; the kernel radius is ceil(3 sigma).

  Returns:
    (B, H, W, C) float32 in [0, 1].
  """
  _check_images(images)
  return _clip(_blur(images, float(sigma)))


@jax.jit
def adjust_contrast(images: chex.Array, factors: chex.Array) -> chex.Array:
  """Scales each image's deviation from its own mean: ``mean + factor * (x - mean)``.

  Args:
    images: (B, H, W, C) float32.
    factors: (B,) or scalar; 1 = identity, < 1 reduces contrast.
  """
  _check_images(images)
  factors = _per_image(factors, images.shape[0])[:, None, None, None]
  mean = images.mean(axis=(1, 2, 3), keepdims=True)
  return _clip(mean + factors * (images - mean))


@jax.jit
def adjust_brightness(images: chex.Array, deltas: chex.Array) -> chex.Array:
  """Adds ``deltas`` (B,) or scalar, in intensity units, to each image."""
  _check_images(images)
  return _clip(images + _per_image(deltas, images.shape[0])[:, None, None, None])


@jax.jit
def scale_brightness(images: chex.Array, factors: chex.Array) -> chex.Array:
  """Multiplies each image by ``factors`` (B,) or scalar: torchvision's ``adjust_brightness``
  (a blend with a black image); 1 = identity, 0 = black.

  Args:
    images: (B, H, W, C) float32.
    factors: (B,) or scalar, non-negative.

  Returns:
    (B, H, W, C) float32 in [0, 1].
  """
  _check_images(images)
  return _clip(images * _per_image(factors, images.shape[0])[:, None, None, None])


@jax.jit
def erase(images: chex.Array, boxes: chex.Array) -> chex.Array:
  """Sets one box per image to 0 (cut-out; torchvision's ``RandomErasing`` with value 0).

  Args:
    images: (B, H, W, C) float32.
    boxes: (B, 4) or (4,), (top, left, height, width) in pixels; pixel (r, c) is zeroed where
      top <= r < top + height and left <= c < left + width (all channels). Height or width 0
      leaves the image unchanged.

  Returns:
    (B, H, W, C) float32 in [0, 1].
  """
  _check_images(images)
  boxes = jnp.broadcast_to(jnp.asarray(boxes, jnp.float32), (images.shape[0], 4))
  top, left, height, width = (boxes[:, i, None, None] for i in range(4))
  r, c = _grid(images)
  inside = (r >= top) & (r < top + height) & (c >= left) & (c < left + width)
  return _clip(jnp.where(inside[..., None], 0.0, images))


# ----------------------------------------------------------------------------------------------
# Random augmentations: fn(key, images) -> images.
# ----------------------------------------------------------------------------------------------


def _crop_shifts(key, batch, max_shift):
  """(batch, 2) integer shifts uniform on {-m, ..., m}^2, m = round(max_shift)."""
  m = jnp.round(jnp.asarray(max_shift, jnp.float32))
  return jnp.floor(jax.random.uniform(key, (batch, 2)) * (2 * m + 1)) - m


def _rotation_angles(key, batch, max_degrees):
  """(batch,) radians uniform on [-max_degrees, max_degrees] degrees."""
  max_rad = jnp.deg2rad(jnp.asarray(max_degrees, jnp.float32))
  return jax.random.uniform(key, (batch,), minval=-1.0, maxval=1.0) * max_rad


def _elastic_field(key, images, alpha, sigma):
  """(B, H, W, 2) displacements: uniform [-1, 1], Gaussian-smoothed (sigma px), times alpha."""
  field = jax.random.uniform(key, (*images.shape[:3], 2), jnp.float32, minval=-1.0, maxval=1.0)
  return _blur(field, float(sigma)) * jnp.asarray(alpha, jnp.float32)


def random_crop(key: chex.PRNGKey, images: chex.Array, max_shift: float = 4.0) -> chex.Array:
  """Pad-and-crop: pads by ``max_shift`` zeros and crops back at a random integer offset.

  Equivalently, moves each image by an integer shift drawn uniformly from
  {-m, ..., m}^2 with m = round(max_shift).
  """
  _check_images(images)
  return translate(images, _crop_shifts(key, images.shape[0], max_shift))


def random_rotate(key: chex.PRNGKey, images: chex.Array, max_degrees: float = 30.0) -> chex.Array:
  """Rotates each image by an angle drawn uniformly from [-max_degrees, max_degrees] degrees."""
  _check_images(images)
  return rotate(images, _rotation_angles(key, images.shape[0], max_degrees))


def elastic(
    key: chex.PRNGKey, images: chex.Array, alpha: float = 34.0, sigma: float = 4.0
) -> chex.Array:
  """Elastic distortion (Simard et al. 2003): a smooth random displacement field.

  A field uniform in [-1, 1] per pixel and axis is smoothed by a Gaussian of ``sigma`` pixels
  (static) and scaled by ``alpha`` pixels; each output pixel reads the input at its displaced
  position. alpha = 0 is the identity.
  """
  _check_images(images)
  field = _elastic_field(key, images, alpha, sigma)
  return warp(images, *_displacement_map(*_grid(images), field))


def intensity_jitter(
    key: chex.PRNGKey, images: chex.Array, brightness: float = 0.2, contrast: float = 0.4
) -> chex.Array:
  """Random contrast factor in [1 - contrast, 1 + contrast], then a brightness shift in
  [-brightness, brightness] (intensity units), per image."""
  _check_images(images)
  k_c, k_b = jax.random.split(key)
  b = images.shape[0]
  factors = 1.0 + contrast * jax.random.uniform(k_c, (b,), minval=-1.0, maxval=1.0)
  deltas = brightness * jax.random.uniform(k_b, (b,), minval=-1.0, maxval=1.0)
  return adjust_brightness(adjust_contrast(images, factors), deltas)


def _partners(key: chex.PRNGKey, images: chex.Array) -> chex.Array:
  """Each image's mixing partner: the batch under a random permutation."""
  return images[jax.random.permutation(key, images.shape[0])]


def mixup(key: chex.PRNGKey, images: chex.Array, alpha: float = 1.0) -> chex.Array:
  """Mixup: ``lam * x + (1 - lam) * x[perm]`` with lam ~ Beta(alpha, alpha) per image.

  ``alpha`` is a static Python float; the default 1 (lam uniform on [0, 1]) avoids the gamma
  sampler behind ``jax.random.beta``, which takes seconds to compile on CPU.
  """
  _check_images(images)
  k_perm, k_lam = jax.random.split(key)
  shape = (images.shape[0],)
  if alpha == 1.0:
    lam = jax.random.uniform(k_lam, shape)
  else:
    lam = jax.random.beta(k_lam, alpha, alpha, shape)
  lam = lam.astype(images.dtype)[:, None, None, None]
  return _clip(lam * images + (1.0 - lam) * _partners(k_perm, images))


def cutmix(key: chex.PRNGKey, images: chex.Array) -> chex.Array:
  """CutMix: pastes a random box of a partner image into each image.

  The box has side fractions sqrt(1 - lam), lam ~ U(0, 1), and a uniformly random centre; it is
  clipped at the image border.
  """
  _check_images(images)
  b, h, w = images.shape[:3]
  k_perm, k_lam, k_cy, k_cx = jax.random.split(key, 4)
  cut = jnp.sqrt(1.0 - jax.random.uniform(k_lam, (b,)))[:, None, None]
  cy = jax.random.uniform(k_cy, (b,))[:, None, None] * h
  cx = jax.random.uniform(k_cx, (b,))[:, None, None] * w
  r, c = _grid(images)
  inside = (jnp.abs(r + 0.5 - cy) < cut * h / 2) & (jnp.abs(c + 0.5 - cx) < cut * w / 2)
  return jnp.where(inside[..., None], _partners(k_perm, images), images)


# ----------------------------------------------------------------------------------------------
# Combinators and pipelines.
# ----------------------------------------------------------------------------------------------


def compose(*fns: Augmentation) -> Augmentation:
  """Applies ``fns`` in order, each with its own key split from the one given."""

  def composed(key: chex.PRNGKey, images: chex.Array) -> chex.Array:
    _check_images(images)
    for k, fn in zip(jax.random.split(key, max(len(fns), 1)), fns):
      images = fn(k, images)
    return images

  return composed


def _coins(key: chex.PRNGKey, p: float, batch: int) -> chex.Array:
  """(batch,) bool, each True with probability p clipped to [0, 1]."""
  return jax.random.bernoulli(key, jnp.clip(p, 0.0, 1.0), (batch,))


def apply_with_probability(
    key: chex.PRNGKey, fn: Augmentation, images: chex.Array, p: float
) -> chex.Array:
  """Applies ``fn`` to each image independently with probability ``p`` (may be traced)."""
  _check_images(images)
  k_fn, k_mask = jax.random.split(key)
  mask = _coins(k_mask, p, images.shape[0])
  return jnp.where(mask[:, None, None, None], fn(k_fn, images), images)


def random_apply(fn: Augmentation, p: float) -> Augmentation:
  """``fn`` applied per image with probability ``p``, as an Augmentation."""
  return lambda key, images: apply_with_probability(key, fn, images, p)


def random_augment(key: chex.PRNGKey, images: chex.Array, strength: float = 1.0) -> chex.Array:
  """A random mixture of augmentations per image, for CSD-Aug contexts.

  In order: pad-and-crop shift (up to 4 s px, p = 0.8 s), rotation (up to 45 s degrees,
  p = 0.5 s), elastic distortion (alpha = 34 s px, sigma = 4 px, p = 0.3 s), intensity jitter
  (brightness 0.2 s, contrast 0.4 s, p = 0.8 s), mixup (p = 0.2 s), cutmix (p = 0.2 s), where
  s = ``strength`` and probabilities are clipped to [0, 1]. Each image draws its own subset and
  parameters. The three geometric transforms are resampled once, as one composed coordinate map.
  strength = 0 is exactly the identity. ``strength`` may be traced.

  Args:
    key: PRNG key.
    images: (B, H, W, C) float32 in [0, 1].
    strength: non-negative scalar scaling both magnitudes and probabilities.

  Returns:
    (B, H, W, C) float32 in [0, 1].
  """
  _check_images(images)
  s = jnp.asarray(strength, jnp.float32)
  b = images.shape[0]
  keys = jax.random.split(key, 7)

  def gate(k, p):  # (B,) 1.0 where the transform applies, else 0.0 (its parameters vanish).
    return _coins(k, p * s, b).astype(jnp.float32)

  shifts = _crop_shifts(keys[0], b, 4.0 * s) * gate(keys[1], 0.8)[:, None]
  angles = _rotation_angles(keys[2], b, 45.0 * s) * gate(keys[3], 0.5)
  field = _elastic_field(keys[4], images, 34.0 * s, 4.0) * gate(keys[5], 0.3)[:, None, None, None]
  coords = _displacement_map(*_grid(images), field)  # last transform's map first
  coords = _rotation_map(*coords, angles)
  images = warp(images, *_shift_map(*coords, shifts))
  rest = compose(
      random_apply(
          lambda k, x: intensity_jitter(k, x, brightness=0.2 * s, contrast=0.4 * s), 0.8 * s
      ),
      random_apply(mixup, 0.2 * s),
      random_apply(cutmix, 0.2 * s),
  )
  return rest(keys[6], images)


def default_augmentation(key: chex.PRNGKey, images: chex.Array) -> chex.Array:
  """The default CSD-Aug pipeline: ``random_augment`` at strength 1."""
  return random_augment(key, images, strength=1.0)


# ----------------------------------------------------------------------------------------------
# The CSD paper's CSD-Aug pipeline (contrastive-learning augmentations, Chen et al. 2020).
# ----------------------------------------------------------------------------------------------

PAPER_AUGMENTATIONS = defaults.PAPER_AUGMENTATIONS
# Not in the default list, the VizDoom contexts' own: a horizontal flip alone (a first-person
# view's world has a floor and a ceiling) and a random perspective.
EXTRA_AUGMENTATIONS = ("hflip", "perspective")


def paper_augment(
    key: chex.PRNGKey, images: chex.Array, include: tuple[str, ...] = PAPER_AUGMENTATIONS
) -> chex.Array:
  """The CSD paper's context augmentations (thesis App. B), each drawn per image.

  ``flip``: horizontal and vertical flips, p = 0.5 each; ``hflip`` (not a default): the
  horizontal flip alone, p = 0.5; ``perspective`` (not a default): torchvision's
  ``RandomPerspective(distortion_scale=0.5)``, each corner moved inward by up to half the
  half-side, p = 0.5; ``rotation``: uniform in ±180°,
  p = 0.5; ``crop``: random resized crop of area fraction U[0.75, 1] (same aspect), p = 0.5;
  ``blur``: Gaussian, σ = 1 px, p = 0.5; ``brightness_contrast``: brightness factor and
  contrast factor each U[0, 2] (torchvision ``ColorJitter(1, 1)``), p = 0.5. The paper gives
  the list and the blur / crop / jitter magnitudes, not the per-transform probabilities (0.5
  here). The geometric transforms (perspective first, then the affine ones) are one composed
  coordinate map, resampled once.

  Args:
    key: PRNG key.
    images: (B, H, W, C) float32 in [0, 1].
    include: the subset of ``PAPER_AUGMENTATIONS`` + ``EXTRA_AUGMENTATIONS`` to use (static),
      e.g. without ``rotation`` when rotated images are an evaluated OOD set.

  Returns:
    (B, H, W, C) float32 in [0, 1].
  """
  _check_images(images)
  valid = PAPER_AUGMENTATIONS + EXTRA_AUGMENTATIONS
  unknown = sorted(set(include) - set(valid))
  if unknown:
    raise ValueError(f"include: unknown augmentations {unknown}; valid: {valid}")
  b, h, w = images.shape[:3]
  k = jax.random.split(key, 12)
  on = lambda name, kk: (_coins(kk, 0.5, b) if name in include else jnp.zeros((b,), bool)).astype(
      jnp.float32
  )
  # Output pixel p reads input pixel centre + A (p − centre) + t, A = flips · rotation · zoom.
  sign_r = 1.0 - 2.0 * on("flip", k[0])
  sign_c = 1.0 - 2.0 * jnp.maximum(on("flip", k[1]), on("hflip", k[1]))
  theta = jnp.deg2rad(jax.random.uniform(k[2], (b,), minval=-180.0, maxval=180.0)) * on(
      "rotation", k[3]
  )
  crop = on("crop", k[4])
  zoom = 1.0 - crop * (1.0 - jnp.sqrt(jax.random.uniform(k[5], (b,), minval=0.75, maxval=1.0)))
  room = (1.0 - zoom)[:, None] * jnp.array([h, w], jnp.float32) / 2.0
  t = room * jax.random.uniform(k[6], (b, 2), minval=-1.0, maxval=1.0)
  rows, cols = _grid(images)
  cr, cc = (h - 1) / 2.0, (w - 1) / 2.0
  dr, dc = rows - cr, cols - cc
  cos, sin = jnp.cos(theta)[:, None, None], jnp.sin(theta)[:, None, None]
  z = zoom[:, None, None]
  src_r = cr + sign_r[:, None, None] * z * (cos * dr - sin * dc) + t[:, 0, None, None]
  src_c = cc + sign_c[:, None, None] * z * (sin * dr + cos * dc) + t[:, 1, None, None]
  if "perspective" in include:
    k_coin, k_end = jax.random.split(k[11])
    tilt = on("perspective", k_coin)[:, None, None]
    end = _perspective_endpoints(k_end, b, h, w, 0.5)
    end = tilt * end + (1.0 - tilt) * _corners(h, w)  # untilted images keep their corners
    src_r, src_c = _perspective_map(src_r, src_c, end)
  out = warp(images, src_r, src_c)
  blur = on("blur", k[7])[:, None, None, None]
  out = blur * gaussian_blur(out, 1.0) + (1.0 - blur) * out
  jitter = on("brightness_contrast", k[8])
  bright = 1.0 + jitter * jax.random.uniform(k[9], (b,), minval=-1.0, maxval=1.0)
  contrast = 1.0 + jitter * jax.random.uniform(k[10], (b,), minval=-1.0, maxval=1.0)
  return adjust_contrast(_clip(out * bright[:, None, None, None]), contrast)
