"""The validation binaries' figures (matplotlib, non-interactive Agg backend)."""

from __future__ import annotations

import math
import os

import matplotlib
import numpy as np


def figure(nrows: int = 1, ncols: int = 1, size: tuple[float, float] = (5.0, 4.0)):
  """A matplotlib (fig, axes (nrows, ncols)) on the Agg backend."""
  matplotlib.use("Agg")
  # pyplot picks its backend when first imported: imported here, after use("Agg"), so that
  # importing this module leaves matplotlib's global state alone.
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  fig, axes = plt.subplots(nrows, ncols, figsize=(size[0] * ncols, size[1] * nrows), squeeze=False)
  return fig, axes


def plot_against_width(ax, widths, errs, label: str) -> None:
  """Log-log ``errs`` vs ``widths`` (both (K,)) with the ``c/√width`` reference (c fitted in
  log space)."""
  ax.loglog(widths, errs, "o-", label=label)
  c = math.exp(np.mean(np.log(errs) + 0.5 * np.log(widths)))
  grid = np.geomspace(widths[0], widths[-1], 50)
  ax.loglog(grid, c / np.sqrt(grid), "k--", label="c / √width")
  ax.set_xticks(widths)
  ax.set_xticklabels([str(w) for w in widths])
  ax.minorticks_off()
  ax.set_xlabel("width")


def save_figure(fig, out_dir: str, name: str) -> str:
  """Saves ``out_dir/name.png`` and closes the figure; returns the path."""
  os.makedirs(out_dir, exist_ok=True)
  path = os.path.join(out_dir, f"{name}.png")
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top  (see figure())

  plt.close(fig)
  return path
