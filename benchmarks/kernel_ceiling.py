r"""The best a variance-of-a-kernel score can do on the OOD benchmark, layer by layer.

    python -m benchmarks.kernel_ceiling --out_dir=out/kernel_ceiling

CSD converges to the closed-form NTK-GP variance of its label kernel (``ntkgp_exact`` in
``benchmarks.ood``: Spearman 0.98 at the default budget), so its AUROC is capped by what that
kernel's exact variance can separate. This binary measures the cap for the kernels one could
pick from the benchmark's own trained classifier (the same classifier, key and budget every
method uses): the linear kernel of each layer's post-activation features (``conv1``, ``conv2``,
``dense`` = CSD's last-layer kernel, ``logits``) and of the raw ``pixels``, each at several
ridges. Score: the relative variance V(x)/k(x,x) (``posterior.ntkgp_variance_from_features``,
ridge relative to tr Σ_X as in ``methods.exact_default_config``), float64.

Writes ``kernel_ceiling.json`` ({kernel: {ridge: {pair: AUROC}}}, mean over seeds) and
``kernel_ceiling.md`` (one row per kernel × ridge, the per-pair AUROC and the mean).
"""

from __future__ import annotations

import os
import sys

from absl import app
from absl import flags

from uncertainty_kit import flag_checks

FLAGS = flags.FLAGS
LAYERS = ("pixels", "conv1", "conv2", "dense", "logits")


def define_flags() -> None:
  """This binary's flags (called under ``__main__`` only)."""
  flags.DEFINE_string("out_dir", "out/kernel_ceiling", "Output directory.")
  flags.DEFINE_integer("seeds", 2, "Seeds (the OOD benchmark's tasks and classifiers).")
  flags.DEFINE_list("ridges", ["1e-7", "1e-6", "1e-5", "1e-4", "1e-3"],
                    "Ridges, relative to tr Σ_X.")
  flags.DEFINE_list("layers", list(LAYERS), f"Kernels, from {', '.join(LAYERS)}.")
  flags.DEFINE_bool("quick", False, "Tiny run for tests.")
  flag_checks.positive("seeds")
  flag_checks.writable_dir("out_dir")
  flags.register_validator("layers", lambda v: bool(v) and set(v) <= set(LAYERS),
                           message=f"--layers must be a non-empty subset of {LAYERS}")
  flags.register_validator("ridges", _valid_ridges, message="--ridges must be positive floats")


def _valid_ridges(values) -> bool:
  try:
    return bool(values) and all(float(v) > 0 for v in values)
  except ValueError:
    return False


def layer_features(spec, params, x):
  """{layer: (B, n) post-activation features}: every conv / dense layer, the logits, pixels."""
  import jax
  from csd_jax import models
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


def main(argv):
  del argv
  import jax
  import jax.numpy as jnp
  import numpy as np

  from benchmarks import protocol
  from benchmarks import ood
  from uncertainty_kit import metrics
  from uncertainty_kit import methods
  from csd_jax import posterior
  from uncertainty_kit import train
  from uncertainty_kit import base

  os.makedirs(FLAGS.out_dir, exist_ok=True)
  flag_checks.record(FLAGS.out_dir, "kernel_ceiling")
  ridges = [float(r) for r in FLAGS.ridges]
  config = methods.config_for("csd")
  if FLAGS.quick:
    config = train.merge(config, methods.small_budget("csd", ood.QUICK_STEPS))
  spec = base.classifier_spec(config)
  # 1. In float32, as the OOD benchmark (x64 would change its random streams): each seed's
  # classifier and every layer's features of the training, test and OOD inputs.
  seeds = []
  for seed in range(FLAGS.seeds):
    task = protocol.embedded_tasks(seed, 1000, *((600, 150) if FLAGS.quick else (None, None)))[0]
    key = base.classifier_key(ood._task_key(seed, task.name))
    params, _ = train.cached_classifier(key, spec, task.train.images, task.train.labels,
                                        **base.train_kwargs(config))
    feats = jax.jit(lambda x, params=params: layer_features(spec, params, x))

    def features(images):
      parts = [feats(jnp.asarray(images[i:i + 500])) for i in range(0, len(images), 500)]
      return {k: np.concatenate([np.asarray(p[k], np.float64) for p in parts], 0)
              for k in FLAGS.layers}

    sets = {"__train__": features(task.train.images), "__id__": features(task.test.images)}
    sets.update({name: features(ds.images) for name, ds in task.ood_eval.items()})
    seeds.append(sets)
  # 2. The closed forms in float64.
  jax.config.update("jax_enable_x64", True)
  with_one = lambda f: jnp.concatenate([jnp.asarray(f), jnp.ones((f.shape[0], 1))], 1)
  per_seed = []
  for seed, sets in enumerate(seeds):
    result = {}
    for layer in FLAGS.layers:
      phi = with_one(sets["__train__"][layer])
      for ridge in ridges:
        def score(f):
          q = with_one(f[layer])
          v = posterior.ntkgp_variance_from_features(phi, q, ridge * phi.shape[0])
          return np.asarray(v / jnp.sum(q * q, -1))
        s_id = score(sets["__id__"])
        result[(layer, ridge)] = {
            name: 100 * metrics.ood_metrics(s_id, score(sets[name]))["auroc"]
            for name in task.ood_eval}
      print(f"[kernel_ceiling] seed {seed}: {layer} done", file=sys.stderr, flush=True)
    per_seed.append(result)
  pairs = list(task.ood_eval)
  table = {}
  for (layer, ridge) in per_seed[0]:
    row = {p: float(np.mean([r[(layer, ridge)][p] for r in per_seed])) for p in pairs}
    row["mean"] = float(np.mean([row[p] for p in pairs]))
    table.setdefault(layer, {})[f"{ridge:g}"] = row
  train.write_json(os.path.join(FLAGS.out_dir, "kernel_ceiling.json"),
                   {"auroc": table, "pairs": pairs, "seeds": FLAGS.seeds, "quick": FLAGS.quick,
                    "score": "relative NTK-GP variance V(x)/k(x,x) of each layer's linear "
                             "kernel (+ constant), ridge relative to tr Σ_X"})
  lines = [f"# Closed-form kernel variance as an OOD score ({FLAGS.seeds} seeds, AUROC %)", "",
           "| kernel | ridge | " + " | ".join(pairs) + " | mean |",
           "|---|---|" + "---|" * (len(pairs) + 1)]
  for layer, rows in table.items():
    for ridge, row in rows.items():
      lines.append(f"| {layer} | {ridge} | " + " | ".join(f"{row[p]:.1f}" for p in pairs)
                   + f" | {row['mean']:.2f} |")
  with open(os.path.join(FLAGS.out_dir, "kernel_ceiling.md"), "w") as f:
    f.write("\n".join(lines) + "\n")
  print("\n".join(lines))


if __name__ == "__main__":
  define_flags()
  app.run(main)
