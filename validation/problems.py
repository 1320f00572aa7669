"""The toy problems of the validation binaries (float64 numpy arrays).

* ``toy_1d``: a 1-D regression set in two clusters, lifted by a fixed random Fourier embedding
  ``FourierEmbedding`` (``e(x) = sqrt(2/m) cos(w x + b)``, w ~ N(0, scale²), b ~ U[0, 2π)) so the
  networks see an m-dimensional input. Raw 1-D inputs are a degenerate toy for ReLU nets with a
  small bias (docs/design.md §3: their last-layer variance is ~0 everywhere): x > 0 and x < 0
  give nearly collinear features. Through the embedding, points a few length scales apart have
  nearly orthogonal inputs, so the variance really grows away from the data.
* ``toy_2d``: two Gaussian clusters in the plane (the docs/design.md §3 probe), queries uniform
  in a box.
* ``sphere_points``: points uniform on a sphere (well-conditioned kernels for exact checks).
"""

from __future__ import annotations

import numpy as np


class FourierEmbedding:
  """A fixed random Fourier embedding of scalars: ``e(x) = sqrt(2/m) cos(x w + b)``, (M, m).

  With w ~ N(0, 1/length_scale²), ``e(x)·e(x')`` ≈ exp(−(x − x')² / (2 length_scale²)) and
  ``‖e(x)‖² ≈ 1``: nearby inputs map to nearly parallel vectors, distant ones to nearly
  orthogonal ones.
  """

  def __init__(self, dim: int = 32, length_scale: float = 1.0, seed: int = 0):
    rng = np.random.default_rng(10_000 + seed)
    self.dim = dim
    self.w = rng.normal(0.0, 1.0 / length_scale, (1, dim))
    self.b = rng.uniform(0.0, 2.0 * np.pi, dim)

  def __call__(self, x) -> np.ndarray:
    x = np.asarray(x, np.float64).reshape(-1, 1)
    return np.sqrt(2.0 / self.dim) * np.cos(x @ self.w + self.b)


def toy_1d(
    seed: int = 0,
    n_per_cluster: int = 10,
    centres=(-2.0, 1.5),
    std: float = 0.4,
    num_queries: int = 241,
    query_range: float = 6.0,
    embed_dim: int = 32,
    length_scale: float = 1.0,
    noise: float = 0.05,
) -> dict:
  """1-D regression toy (two clusters), lifted by ``FourierEmbedding``.

  Returns a dict:
    t_train (N,), y_train (N,): raw inputs and targets y = sin(2t) + noise.
    x_train (N, m): embedded inputs.  t_query (M,), x_query (M, m): a grid on ±query_range.
    in_dist (M,) bool: queries within 2·std of a cluster centre.  embed: the FourierEmbedding.
  """
  rng = np.random.default_rng(seed)
  t = np.concatenate([rng.normal(c, std, n_per_cluster) for c in centres])
  y = np.sin(2.0 * t) + noise * rng.normal(size=t.shape)
  emb = FourierEmbedding(embed_dim, length_scale, seed)
  tq = np.linspace(-query_range, query_range, num_queries)
  in_dist = np.min(np.abs(tq[:, None] - np.asarray(centres)[None]), axis=1) <= 2.0 * std
  return {
      "t_train": t,
      "y_train": y,
      "x_train": emb(t),
      "t_query": tq,
      "x_query": emb(tq),
      "in_dist": in_dist,
      "embed": emb,
  }


def toy_2d(
    seed: int = 0,
    n_per_cluster: int = 20,
    centre: float = 1.5,
    std: float = 0.4,
    num_queries: int = 400,
    box: float = 4.0,
) -> dict:
  """Two Gaussian clusters at (±centre, ±centre) in the plane (the docs/design.md §3 probe).

  Returns a dict: x_train (N, 2); x_query (M, 2) uniform in [−box, box]²; in_dist (M,) bool:
  within 2·std·sqrt(2) of a cluster centre (≈ the clusters' 86 % mass radius); centres (2, 2).
  """
  rng = np.random.default_rng(seed)
  centres = np.array([[-centre, -centre], [centre, centre]])
  x = np.concatenate([rng.normal(c, std, (n_per_cluster, 2)) for c in centres])
  xq = rng.uniform(-box, box, (num_queries, 2))
  dist = np.min(np.linalg.norm(xq[:, None] - centres[None], axis=-1), axis=1)
  return {
      "x_train": x,
      "x_query": xq,
      "in_dist": dist <= 2.0 * std * np.sqrt(2.0),
      "centres": centres,
  }


def sphere_points(rng: np.random.Generator, n: int, dim: int, radius: float = 1.0) -> np.ndarray:
  """(n, dim) points uniform on the sphere of ``radius`` in R^dim."""
  x = rng.normal(size=(n, dim))
  return radius * x / np.linalg.norm(x, axis=1, keepdims=True)
