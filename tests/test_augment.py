"""Tests for uncertainty_kit.augment."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from uncertainty_kit import augment

B, H, W, C = 4, 28, 28, 1


def _digits_like(seed=0, batch=B, width=3.0):
  """Smooth blobs (std ``width`` px) near the centre of a zero background, float32
  (batch, H, W, C) in [0, 1]."""
  rng = np.random.default_rng(seed)
  r, c = np.mgrid[:H, :W]
  centres = rng.uniform(11, 17, (batch, 2))
  blobs = np.exp(
      -((r - centres[:, 0, None, None]) ** 2 + (c - centres[:, 1, None, None]) ** 2)
      / (2 * width**2)
  )
  noise = rng.uniform(0, 0.3, (batch, H, W)) * (blobs > 0.3)
  return jnp.asarray(np.clip(blobs + noise, 0, 1)[..., None], jnp.float32)


# One compilation of random_augment with a traced strength, shared by the tests below.
_random_augment = jax.jit(augment.random_augment)

RANDOM_AUGMENTATIONS = {
    "random_crop": augment.random_crop,
    "random_rotate": augment.random_rotate,
    "elastic": augment.elastic,
    "intensity_jitter": augment.intensity_jitter,
    "mixup": augment.mixup,
    "cutmix": augment.cutmix,
}


@pytest.fixture(scope="module")
def images():
  return _digits_like()


_JITTED = {name: jax.jit(fn) for name, fn in RANDOM_AUGMENTATIONS.items()}
_JITTED["random_augment"] = lambda key, images: _random_augment(key, images, 1.0)


@pytest.fixture(scope="module", params=sorted(_JITTED))
def jitted(request):
  return request.param, _JITTED[request.param]


def test_shape_dtype_range_and_jit_matches_eager(jitted, images):
  name, fn = jitted
  key = jax.random.PRNGKey(0)
  out = fn(key, images)
  chex.assert_shape(out, images.shape)
  chex.assert_type(out, jnp.float32)
  assert float(out.min()) >= 0.0 and float(out.max()) <= 1.0, name
  if name == "random_crop":  # eager runs are slow: compare one with its jitted self
    np.testing.assert_allclose(RANDOM_AUGMENTATIONS[name](key, images), out, atol=1e-5)
  if name == "mixup":  # the Beta(alpha != 1) branch, traced only: the gamma sampler compiles slowly
    shape = jax.eval_shape(functools.partial(augment.mixup, alpha=0.4), key, images)
    assert shape.shape == images.shape and shape.dtype == jnp.float32


def test_deterministic_per_key_and_keys_differ(jitted, images):
  name, fn = jitted
  k0, k1 = jax.random.PRNGKey(1), jax.random.PRNGKey(2)
  np.testing.assert_array_equal(fn(k0, images), fn(k0, images))
  assert not np.allclose(fn(k0, images), fn(k1, images)), name


def test_rotation_by_zero_is_identity_and_by_90_is_rot90(images):
  np.testing.assert_allclose(augment.rotate(images, 0.0), images, atol=1e-6)
  np.testing.assert_allclose(
      augment.rotate(images, jnp.full((B,), jnp.pi / 2)),
      np.rot90(np.asarray(images), axes=(1, 2)),
      atol=1e-5,
  )
  np.testing.assert_allclose(augment.rotate(images, 2 * jnp.pi), images, atol=1e-4)


def _centre_of_mass(x):
  r, c = np.mgrid[:H, :W]
  x = np.asarray(x)[..., 0]
  m = x.sum(axis=(1, 2))
  return np.stack([(x * r).sum(axis=(1, 2)) / m, (x * c).sum(axis=(1, 2)) / m], axis=1)


@pytest.fixture(scope="module")
def compact():
  """Blobs that stay inside the frame under shifts of up to 4 px."""
  return _digits_like(seed=2, width=1.5)


def test_composed_coordinate_maps_equal_sequential_warps(compact):
  # random_augment resamples shift -> rotate -> elastic once; exact cases must agree with
  # applying the primitives one after another.
  images = compact
  shifts = jnp.array([[2, -1], [0, 3], [-2, 0], [1, 1]], jnp.float32)
  angles = jnp.full((B,), jnp.pi / 2)
  field = jnp.zeros((B, H, W, 2)).at[..., 1].set(1.0)  # read one pixel to the right
  coords = augment._displacement_map(*augment._grid(images), field)
  coords = augment._rotation_map(*coords, angles)
  once = augment.warp(images, *augment._shift_map(*coords, shifts))
  sequential = augment.translate(
      augment.rotate(augment.translate(images, shifts), angles), jnp.array([0.0, -1.0])
  )
  np.testing.assert_allclose(once, sequential, atol=1e-5)


def test_translate_moves_mass_exactly(compact):
  images = compact
  shifts = jnp.array([[2, 3], [-1, 0], [0, -4], [3, 3]], jnp.float32)
  out = augment.translate(images, shifts)
  np.testing.assert_allclose(_centre_of_mass(out) - _centre_of_mass(images), shifts, atol=1e-3)
  np.testing.assert_allclose(out[0, 2:, 3:], images[0, :-2, :-3], atol=1e-6)


def test_random_crop_moves_mass_by_integer_shifts(compact):
  images = compact
  out = jax.jit(augment.random_crop)(jax.random.PRNGKey(3), images, max_shift=3.0)
  delta = _centre_of_mass(out) - _centre_of_mass(images)
  np.testing.assert_allclose(delta, np.round(delta), atol=1e-3)
  assert np.all(np.abs(delta) <= 3 + 1e-3) and np.any(np.abs(delta) > 0.5)
  np.testing.assert_allclose(out.sum(axis=(1, 2, 3)), images.sum(axis=(1, 2, 3)), rtol=1e-5)


@pytest.mark.parametrize(
    "fn",
    [
        functools.partial(augment.random_crop, max_shift=0.0),
        functools.partial(augment.random_rotate, max_degrees=0.0),
        functools.partial(augment.elastic, alpha=0.0),
        functools.partial(augment.intensity_jitter, brightness=0.0, contrast=0.0),
        augment.compose(),
    ],
    ids=["crop", "rotate", "elastic", "jitter", "compose()"],
)
def test_zero_magnitude_is_identity(fn, images):
  np.testing.assert_allclose(jax.jit(fn)(jax.random.PRNGKey(4), images), images, atol=1e-6)


def test_random_augment_strength_zero_is_identity(images):
  key = jax.random.PRNGKey(5)
  np.testing.assert_array_equal(_random_augment(key, images, 0.0), images)
  assert not np.allclose(_random_augment(key, images, 1.0), images)


def test_default_augmentation_is_random_augment_at_strength_one(images):
  # Compared as traced programs: compiling the pipeline a second time would cost seconds.
  key = jax.random.PRNGKey(0)
  default = jax.make_jaxpr(augment.default_augmentation)(key, images)
  at_one = jax.make_jaxpr(lambda k, x: augment.random_augment(k, x, 1.0))(key, images)
  assert str(default) == str(at_one)


def test_random_augment_is_a_per_image_mixture(images):
  outs = [_random_augment(k, images, 0.5) for k in jax.random.split(jax.random.PRNGKey(6), 5)]
  changed = np.stack([np.abs(np.asarray(o - images)).max(axis=(1, 2, 3)) > 1e-6 for o in outs])
  assert 0 < changed.sum() < changed.size  # some images are left alone, others are not


def test_blur_contrast_brightness_primitives(images):
  np.testing.assert_array_equal(augment.gaussian_blur(images, 0.0), images)
  blurred = augment.gaussian_blur(images, 1.0)
  np.testing.assert_allclose(blurred.sum(axis=(1, 2, 3)), images.sum(axis=(1, 2, 3)), rtol=1e-3)
  assert float(blurred.max()) < float(images.max())
  np.testing.assert_allclose(augment.adjust_contrast(images, 1.0), images, atol=1e-6)
  flat = augment.adjust_contrast(images, 0.0)
  np.testing.assert_allclose(
      flat, jnp.broadcast_to(images.mean(axis=(1, 2, 3), keepdims=True), images.shape), atol=1e-6
  )
  np.testing.assert_allclose(augment.adjust_brightness(images, 0.0), images)
  assert float(augment.adjust_brightness(images, 2.0).min()) == 1.0


def test_mixing_draws_only_from_the_batch(images):
  same = jnp.broadcast_to(images[:1], images.shape)
  np.testing.assert_allclose(_JITTED["mixup"](jax.random.PRNGKey(7), same), same, atol=1e-6)
  out = np.asarray(_JITTED["cutmix"](jax.random.PRNGKey(8), images))
  x = np.asarray(images)
  from_batch = np.any(np.isclose(out[:, None], x[None]), axis=1)  # each pixel from some image
  assert from_batch.all()


def test_compose_applies_in_order_with_split_keys(images):
  def brighten(key, x):
    return augment.adjust_brightness(x, 0.1 * jax.random.uniform(key, ()))

  def flatten(key, x):
    return augment.adjust_contrast(x, 0.5)

  key = jax.random.PRNGKey(10)
  k1, k2 = jax.random.split(key)
  np.testing.assert_allclose(
      augment.compose(brighten, flatten)(key, images), flatten(k2, brighten(k1, images)), atol=1e-6
  )
  np.testing.assert_allclose(
      augment.compose(brighten)(key, images),
      brighten(jax.random.split(key, 1)[0], images),
      atol=1e-6,
  )


def test_vmap_over_keys_and_batches(images):
  keys = jax.random.split(jax.random.PRNGKey(9), 2)
  stacked = jnp.stack([images, images[::-1]])
  out = jax.jit(jax.vmap(augment.random_crop))(keys, stacked)
  chex.assert_shape(out, stacked.shape)
  np.testing.assert_allclose(out[1], augment.random_crop(keys[1], stacked[1]), atol=1e-6)


@pytest.mark.parametrize(
    "bad",
    [
        jnp.zeros((H, W, C), jnp.float32),
        jnp.zeros((B, H, W, C), jnp.float16),
        jnp.zeros((B, H, W, C), jnp.uint8),
    ],
)
def test_bad_images_raise(bad):
  with pytest.raises(AssertionError):
    augment.random_rotate(jax.random.PRNGKey(0), bad)
  with pytest.raises(AssertionError):
    augment.compose(augment.random_crop)(jax.random.PRNGKey(0), bad)


def test_paper_augment_hflip_mirrors_columns_only():
  """``hflip`` alone: each image is either unchanged or its column-mirror (never rows); with a
  batch of 16 both happen."""
  images = _digits_like(batch=16)
  out = np.asarray(augment.paper_augment(jax.random.PRNGKey(0), images, include=("hflip",)))
  same = np.all(np.isclose(out, images, atol=1e-5), axis=(1, 2, 3))
  mirrored = np.all(np.isclose(out, images[:, :, ::-1], atol=1e-5), axis=(1, 2, 3))
  assert (same | mirrored).all() and same.any() and mirrored.any()
  with pytest.raises(ValueError, match="unknown augmentations"):
    augment.paper_augment(jax.random.PRNGKey(0), images, include=("vflip",))


def test_perspective_moves_each_corner_to_its_endpoint():
  """A dot on each corner lands on its endpoint; corners as endpoints are the identity."""
  image = np.zeros((1, 12, 10, 1), np.float32)
  corners = [(0, 0), (0, 9), (11, 9), (11, 0)]  # (row, col): TL, TR, BR, BL
  for value, (r, c) in zip((0.25, 0.5, 0.75, 1.0), corners):
    image[0, r, c, 0] = value
  ends = np.array([[2, 3], [6, 1], [8, 10], [1, 7]], np.float32)  # (x, y) = (col, row)
  out = np.asarray(augment.perspective(jnp.asarray(image), ends))
  for value, (x, y) in zip((0.25, 0.5, 0.75, 1.0), ends.astype(int)):
    assert out[0, y, x, 0] == pytest.approx(value, abs=1e-4)
  same = np.array([[0, 0], [9, 0], [9, 11], [0, 11]], np.float32)
  np.testing.assert_allclose(augment.perspective(jnp.asarray(image), same), image, atol=1e-5)


def test_paper_augment_perspective_tilts_some_images():
  images = _digits_like(batch=16)
  out = np.asarray(augment.paper_augment(jax.random.PRNGKey(1), images, include=("perspective",)))
  same = np.all(np.isclose(out, images, atol=1e-5), axis=(1, 2, 3))
  assert same.any() and not same.all()
  assert out.min() >= 0.0 and out.max() <= 1.0
