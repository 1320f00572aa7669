r"""The best a variance-of-a-kernel score can do on the OOD benchmark, layer by layer.

    python -m benchmarks.kernel_ceiling --out_dir=out/kernel_ceiling
    python -m benchmarks.kernel_ceiling --config=configs/kernel_ceiling.py:quick --out_dir=/tmp/kc

The experiment (seeds, ridges, layers, data and budget) is ``configs/kernel_ceiling.py``,
overridden with ``--config.<field>=value``.

CSD converges to the closed-form NTK-GP variance of its label kernel (``ntkgp_exact`` in
``benchmarks.ood``; docs/results.md has the measured agreement), so its AUROC is capped by what
that kernel's exact variance can separate. This binary measures the cap for the kernels one could
pick from the benchmark's own trained classifier (the same classifier, key and budget every
method uses): the linear kernel of each layer's post-activation features (``conv1``, ``conv2``,
``dense`` = CSD's last-layer kernel, ``logits``) and of the raw ``pixels``, each at several
ridges. Score: the relative variance V(x)/k(x,x) (``posterior.ntkgp_variance_from_features``,
ridge relative to tr Σ_X as in ``defaults.exact``), float64.

Writes ``kernel_ceiling.json`` ({kernel: {ridge: {pair: AUROC}}}, mean over seeds) and
``kernel_ceiling.md`` (one row per kernel × ridge, the per-pair AUROC and the mean).
"""

from __future__ import annotations

import os
import sys

from absl import flags
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from benchmarks import ood_cells
from benchmarks import protocol
from cmdline import cli
from csd_jax import models
from csd_jax import posterior
from uncertainty_kit import defaults
from uncertainty_kit import keys
from uncertainty_kit import methods
from uncertainty_kit import metrics
from uncertainty_kit import train

FLAGS = flags.FLAGS
NAME = "kernel_ceiling"
LAYERS = ("pixels", "conv1", "conv2", "dense", "logits")


def define_flags() -> flags.FlagHolder:
  """``--out_dir`` and ``--config`` (configs/kernel_ceiling.py); called under ``__main__``
  only. Returns the config's flag holder."""
  return cli.define_out_dir_and_config(NAME)


def check_config(config: ml_collections.ConfigDict) -> None:
  """Raises ``cli.ConfigError`` naming the first field out of range."""
  cli.check(
      config,
      positive=("seeds", "max_train", "max_test", "classifier_steps"),
      subset_of={"layers": LAYERS},
  )
  if not config.ridges or not all(isinstance(r, (int, float)) and r > 0 for r in config.ridges):
    raise cli.ConfigError(f"--config.ridges must be positive numbers, got {config.ridges!r}")


def layer_features(spec, params, x):
  """{layer: (B, n) post-activation features}: every conv / dense layer, the logits, pixels."""
  net = models.module(spec)
  logits, state = net.apply(params, x, capture_intermediates=True, mutable=["intermediates"])
  inter = state["intermediates"]
  act = {"relu": jax.nn.relu, "erf": jax.scipy.special.erf}[spec.activation]
  flat = lambda a: a.reshape((a.shape[0], -1))
  out = {"pixels": flat(x)}
  for kind in ("conv_layers", "dense_layers"):
    i = 0
    while f"{kind}_{i}" in inter:
      name = f"conv{i + 1}" if kind == "conv_layers" else ("dense" if i == 0 else f"dense{i + 1}")
      out[name] = flat(act(inter[f"{kind}_{i}"]["__call__"][0]))
      i += 1
  out["logits"] = logits
  return out


def run(config: ml_collections.ConfigDict, out_dir: str) -> dict:
  """The AUROC table of ``config`` (configs/kernel_ceiling.py); writes kernel_ceiling.json and
  kernel_ceiling.md to ``out_dir``; returns the json's content."""
  check_config(config)
  os.makedirs(out_dir, exist_ok=True)
  layers = cli.split_list(config.layers)
  ridges = [float(r) for r in config.ridges]
  method_config = methods.config_for(
      "csd",
      None
      if config.classifier_steps is None
      else defaults.small_budget("csd", config.classifier_steps),
  )
  spec = train.classifier_spec(method_config)
  # 1. In float32, as the OOD benchmark (x64 would change its random streams): each seed's
  # classifier and every layer's features of the training, test and OOD inputs.
  seeds = []
  for seed in range(config.seeds):
    task = protocol.embedded_tasks(seed, 1000, config.max_train, config.max_test)[0]
    key = keys.classifier_key(ood_cells.task_key(seed, task.name))
    params, _ = train.cached_classifier(
        key, spec, task.train.images, task.train.labels, **train.train_kwargs(method_config)
    )
    feats = jax.jit(lambda x, params=params: layer_features(spec, params, x))

    def features(images):
      parts = [feats(jnp.asarray(images[i : i + 500])) for i in range(0, len(images), 500)]
      return {k: np.concatenate([np.asarray(p[k], np.float64) for p in parts], 0) for k in layers}

    sets = {"__train__": features(task.train.images), "__id__": features(task.test.images)}
    sets.update({name: features(ds.images) for name, ds in task.ood_eval.items()})
    seeds.append(sets)
  # 2. The closed forms in float64 (only here: the fits above keep the benchmark's float32
  # random streams).
  with jax.enable_x64(True):
    with_one = lambda f: jnp.concatenate([jnp.asarray(f), jnp.ones((f.shape[0], 1))], 1)
    per_seed = []
    for seed, sets in enumerate(seeds):
      aurocs = {}
      for layer in layers:
        phi = with_one(sets["__train__"][layer])
        for ridge in ridges:

          def score(f):
            q = with_one(f[layer])
            v = posterior.ntkgp_variance_from_features(phi, q, ridge * phi.shape[0])
            return np.asarray(v / jnp.sum(q * q, -1))

          s_id = score(sets["__id__"])
          aurocs[(layer, ridge)] = {
              name: 100 * metrics.ood_metrics(s_id, score(sets[name]))["auroc"]
              for name in task.ood_eval
          }
        print(f"[kernel_ceiling] seed {seed}: {layer} done", file=sys.stderr, flush=True)
      per_seed.append(aurocs)
  pairs = list(task.ood_eval)
  table = {}
  for layer, ridge in per_seed[0]:
    row = {p: float(np.mean([r[(layer, ridge)][p] for r in per_seed])) for p in pairs}
    row["mean"] = float(np.mean([row[p] for p in pairs]))
    table.setdefault(layer, {})[f"{ridge:g}"] = row
  result = {
      "auroc": table,
      "pairs": pairs,
      "seeds": config.seeds,
      "config": cli.to_dict(config),
      "score": "relative NTK-GP variance V(x)/k(x,x) of each layer's linear "
      "kernel (+ constant), ridge relative to tr Σ_X",
  }
  train.write_json(os.path.join(out_dir, "kernel_ceiling.json"), result)
  lines = [
      f"# Closed-form kernel variance as an OOD score ({config.seeds} seeds, AUROC %)",
      "",
      "| kernel | ridge | " + " | ".join(pairs) + " | mean |",
      "|---|---|" + "---|" * (len(pairs) + 1),
  ]
  for layer, rows in table.items():
    for ridge, row in rows.items():
      lines.append(
          f"| {layer} | {ridge} | "
          + " | ".join(f"{row[p]:.1f}" for p in pairs)
          + f" | {row['mean']:.2f} |"
      )
  with open(os.path.join(out_dir, "kernel_ceiling.md"), "w") as f:
    f.write("\n".join(lines) + "\n")
  print("\n".join(lines))
  return result


def main(argv, config: ml_collections.ConfigDict):
  cli.start(argv, config, FLAGS.out_dir, NAME, check_config)
  run(config, FLAGS.out_dir)


if __name__ == "__main__":
  config_flag = define_flags()
  cli.run(lambda argv: main(argv, config_flag.value))
