r"""What deep CSD's towers learn, per evaluation set: the picture behind a weak OOD pair.

    python -m benchmarks.csd_diagnostics --out_dir=out/csd_diag            # tuning seed 100
    python -m benchmarks.csd_diagnostics --config.method=csd_aug --config.overrides.num_steps=600 ...

Fits (or restores, from ``--config.checkpoint_dir`` laid out as ``benchmarks.ood`` /
``benchmarks.sweep`` write it) one CSD method on the embedded tasks of one seed and, on the ID
set and every OOD set of the chosen split (default the tuning parts), measures:

* the score 1 − cos(φ(x), ψ(x)) (histogram on log-spaced bins over [1e-3, 2]) and its AUROC
  against the ID set;
* the towers' output norms ‖φ(x)‖, ‖ψ(x)‖ before the unit scaling (``csd.tower_outputs``):
  collapse onto the data shows as OOD norms and angles like the training data's;
* the prior's view: ‖ϕ̃(x)‖ and the cosine of ϕ̃(x) to its nearest training input (the label
  kernel's own idea of familiarity);
* the input's ink (mean pixel value).

Writes ``csd_diagnostics.json`` (per task and set: quantiles of each quantity, histogram counts
of the score, AUROC) and ``csd_diagnostics.png`` (score histograms, tower norms, prior cosines).
"""

from __future__ import annotations

import os

from absl import flags
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from benchmarks import ood_cells
from benchmarks import protocol
from cmdline import cli
from cmdline import flag_checks
from csd_jax import csd
from uncertainty_kit import methods
from uncertainty_kit import metrics
from uncertainty_kit import train

FLAGS = flags.FLAGS
NAME = "csd_diagnostics"
QUANTILES = (0.1, 0.25, 0.5, 0.75, 0.9)


def define_flags() -> None:
  cli.define_config(NAME)
  flags.DEFINE_string("out_dir", "out/csd_diagnostics", "Output directory.")
  flag_checks.writable_dir("out_dir")


def check_config(config: ml_collections.ConfigDict) -> ml_collections.FrozenConfigDict:
  """The method's config; ``cli.ConfigError`` naming the first bad field."""
  cli.check(
      config,
      positive=("num_test", "bins"),
      non_negative=("seed",),
      one_of={
          "split": ("tune", "eval"),
          "method": [
              n
              for n in methods.METHODS
              if n.startswith("csd") and methods.get(n).default_config["towers"] == "deep"
          ],
      },
  )
  try:
    method_config = methods.config_for(config.method, config.overrides)
    methods.check_csd_config(method_config)
  except ValueError as e:
    raise cli.ConfigError(f"--config.overrides: {e}") from None
  return method_config


def set_statistics(model, state, x: np.ndarray, phi_train_unit: jax.Array) -> dict:
  """Per-example quantities of one image set (module docstring): {name: (n,) array}."""
  out = {k: [] for k in ("score", "norm_phi", "norm_psi", "prior_norm", "prior_nearest_cos", "ink")}
  for i in range(0, len(x), 512):
    xb = jnp.asarray(x[i : i + 512])
    phi, psi = csd.tower_outputs(model, state, xb)
    nphi, npsi = jnp.linalg.norm(phi, axis=-1), jnp.linalg.norm(psi, axis=-1)
    out["score"].append(1.0 - jnp.sum(phi * psi, -1) / jnp.maximum(nphi * npsi, 1e-12))
    out["norm_phi"].append(nphi)
    out["norm_psi"].append(npsi)
    prior = csd.label_features(model, state, xb) * jnp.sqrt(state.label_scale)
    pn = jnp.linalg.norm(prior, axis=-1)
    out["prior_norm"].append(pn)
    out["prior_nearest_cos"].append(jnp.max((prior / pn[:, None]) @ phi_train_unit.T, axis=-1))
    out["ink"].append(jnp.mean(xb.reshape(xb.shape[0], -1), axis=-1))
  return {k: np.concatenate([np.asarray(v) for v in vs]) for k, vs in out.items()}


def summarize(stats: dict, bins: np.ndarray) -> dict:
  score = np.clip(stats["score"], bins[0], bins[-1])  # the end bins take what lies beyond
  return {
      "quantiles": {k: np.quantile(v, QUANTILES).tolist() for k, v in stats.items()},
      "score_histogram": np.histogram(score, bins)[0].tolist(),
  }


def run(config: ml_collections.ConfigDict, out_dir: str) -> dict:
  method_config = check_config(config)
  model = methods.csd_model(method_config)
  ckpt_root = config.checkpoint_dir or os.path.join(out_dir, "checkpoints")
  # 1 − cos of trained towers spans decades (1e-2 on the data): log-spaced bins over [1e-3, 2]
  bins = np.geomspace(1e-3, 2.0, config.bins + 1)
  result = {
      "method": config.method,
      "seed": config.seed,
      "split": config.split,
      "quantiles": list(QUANTILES),
      "score_bins": bins.tolist(),
      "tasks": {},
      "config": cli.to_dict(config),
  }
  all_stats = {}
  for task in protocol.embedded_tasks(
      config.seed, num_test=config.num_test, max_train=config.max_train
  ):
    ckpt = os.path.join(ckpt_root, config.method, ood_cells.cell_id(task.name, config.seed))
    fitted, status, _ = ood_cells.fit_or_restore(
        config.method, method_config, task, config.seed, ckpt
    )
    print(f"{NAME}: {task.name}: fit {status}", flush=True)
    state = methods.csd_state(fitted)
    prior_train = csd.label_features(model, state, jnp.asarray(task.train.images))
    unit_train = prior_train / jnp.linalg.norm(prior_train, axis=-1, keepdims=True)
    id_set, oods = (
        (task.tune, task.ood_tune) if config.split == "tune" else (task.test, task.ood_eval)
    )
    sets = {
        "train": task.train.images[: config.num_test],
        "id": id_set.images,
        **{name: ds.images for name, ds in oods.items()},
    }
    stats = {name: set_statistics(model, state, x, unit_train) for name, x in sets.items()}
    all_stats[task.name] = stats
    result["tasks"][task.name] = {
        name: {
            **summarize(s, bins),
            "auroc": None
            if name in ("train", "id")
            else metrics.ood_metrics(stats["id"]["score"], s["score"])["auroc"],
        }
        for name, s in stats.items()
    }
  train.write_json(os.path.join(out_dir, f"{NAME}.json"), result)
  if config.plots:
    plot(all_stats, bins, os.path.join(out_dir, f"{NAME}.png"))
  return result


def plot(all_stats: dict, bins: np.ndarray, path: str) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  panels = (
      ("score", "1 − cos(φ, ψ)"),
      ("norm_phi", "‖φ(x)‖ before unit scaling"),
      ("prior_nearest_cos", "prior: cos to nearest training input"),
  )
  fig, axes = plt.subplots(
      len(all_stats), len(panels), figsize=(4.2 * len(panels), 3.2 * len(all_stats)), squeeze=False
  )
  for row, (task, stats) in zip(axes, all_stats.items()):
    for ax, (key, label) in zip(row, panels):
      values = np.concatenate([s[key] for s in stats.values()])
      edges = bins if key == "score" else np.linspace(values.min(), values.max(), len(bins))
      for name, s in stats.items():
        v = np.clip(s[key], bins[0], bins[-1]) if key == "score" else s[key]
        ax.hist(
            v,
            edges,
            histtype="step",
            density=True,
            label=name,
            linewidth=2.0 if name in ("train", "id") else 1.0,
        )
      if key == "score":
        ax.set_xscale("log")
      ax.set_title(f"{task}: {label}", fontsize=8)
    row[0].legend(fontsize=6)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def main(argv):
  cli.start(argv, FLAGS.config, FLAGS.out_dir, NAME, check_config)
  run(FLAGS.config, FLAGS.out_dir)


if __name__ == "__main__":
  define_flags()
  cli.run(main)
