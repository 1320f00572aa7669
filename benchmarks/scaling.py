r"""Scaling: CSD's fit over 1, 2, 4, … devices, and its per-step cost against the closed form's.

    python -m benchmarks.scaling --out_dir=out/scaling                       # real devices
    python -m benchmarks.scaling --simulated_devices=8 --out_dir=out/scaling # CPU, code path

The experiment is ``configs/scaling.py`` (``--config=configs/scaling.py:quick`` for a tiny run,
``--config.<field>=value`` to override); the flags choose the devices.

1. **Device count.** The OOD benchmark's CSD (its config, prior at random init, on the digits)
   and its plain classifier are fitted with ``--mesh=data=n`` for each n in ``--device_counts``
   (``fitting.fit`` / ``train.train_classifier`` with a ``jax.sharding.Mesh``: batch sharded,
   params replicated). Recorded: steps/s and examples/s (compile excluded), and the largest
   relative difference of the CSD variance on held-out digits from the one-device fit (float
   reassociation only). On simulated CPU devices all "devices" share the same cores, so the
   throughput there checks the code path, not a speed-up; real speed-ups are measured on a
   machine with several accelerators (BUILD.md).
2. **Cost vs N.** For N training points (digits, then their augmentations), the wall-clock of
   the exact closed form (Θ_L Gram, Cholesky, variance of the queries: O(N³)) next to the cost
   of one CSD training step at that N (independent of N: a step touches one Bx × Bc block).

Writes ``scaling.json`` and ``scaling.png`` (both panels, log-log).
"""

from __future__ import annotations

import functools
import os
import sys
import time

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from benchmarks import protocol
from benchmarks import throughput
from cmdline import cli
from cmdline import flag_checks
from csd_jax import csd
from csd_jax import fitting
from csd_jax import parallel
from uncertainty_kit import data
from uncertainty_kit import methods
from uncertainty_kit import train

FLAGS = flags.FLAGS
NAME = "scaling"


def define_flags() -> flags.FlagHolder:
  """``--out_dir``, the device flags and ``--config`` (configs/scaling.py); called under
  ``__main__`` only. Returns the config's flag holder."""
  flags.DEFINE_string("out_dir", "out/scaling", "Output directory.")
  flags.DEFINE_integer(
      "simulated_devices",
      0,
      "CPU only: split the host into this many XLA "
      "devices (XLA_FLAGS=--xla_force_host_platform_device_count); 0 = the "
      "real devices.",
  )
  flags.DEFINE_list("device_counts", [], "Mesh sizes to run (default: 1, 2, 4, … up to all).")
  flag_checks.non_negative("simulated_devices")
  flag_checks.positive_ints("device_counts")
  flag_checks.writable_dir("out_dir")
  return cli.define_config(NAME)


def check_config(config: ml_collections.ConfigDict) -> None:
  """Raises ``cli.ConfigError`` naming the first field out of range."""
  cli.check(
      config,
      non_negative=("seed",),
      positive=(
          "num_train",
          "num_queries",
          "csd_steps",
          "classifier_steps",
          "max_closed_form_seconds",
      ),
  )
  if not config.ns or not all(isinstance(n, int) and n > 0 for n in config.ns):
    raise cli.ConfigError(f"--config.ns must be a list of positive integers, got {config.ns!r}")


# The OOD benchmark's CSD with its prior at random init (csd.init draws it: no classifier to
# train here), hence the init prior's preconditioner jitter (methods.precondition_jitter).
CSD_OVERRIDES = {"prior": "init"}


def log(msg: str) -> None:
  print(f"[scaling] {msg}", file=sys.stderr, flush=True)


def _timed(fn, *args) -> tuple[float, object]:
  jax.block_until_ready(fn(*args))  # compile + warm-up
  t = time.perf_counter()
  out = jax.block_until_ready(fn(*args))
  return time.perf_counter() - t, out


def device_scaling(images, queries, counts, csd_steps: int, cls_steps: int, seed: int) -> list:
  """One row per mesh size: CSD and classifier throughput, CSD agreement with one device."""

  cfg = methods.config_for("csd", CSD_OVERRIDES)
  model = methods.csd_model(cfg)
  bx, bc = int(cfg["batch_size"]), int(cfg["context_batch_size"])
  spec = train.classifier_spec(cfg)
  labels = np.zeros(images.shape[0], np.int32)  # throughput only: the labels do not matter
  key = jax.random.PRNGKey(seed)
  state0 = csd.init(model, key, images)
  rows, ref = [], None
  for n in counts:
    mesh = parallel.make_mesh(f"data={n}")
    fit = functools.partial(
        fitting.fit,
        model,
        state0,
        key,
        images,
        batch_size=bx,
        context_batch_size=bc,
        mesh=mesh,
        log_every=csd_steps,
        verbose=False,
    )
    csd_s, (state, _) = _timed(lambda: fit(num_steps=csd_steps))
    v = np.asarray(csd.variance(model, state, queries)[0])
    ref = v if ref is None else ref
    run = train.RunOptions(mesh=mesh)
    cls_s, _ = _timed(
        lambda: train.train_classifier(
            key, spec, images, labels, num_steps=cls_steps, batch_size=bx, lr=1e-3, run=run
        )[0]
    )
    row = {
        "devices": n,
        "csd_steps_per_s": csd_steps / csd_s,
        "csd_examples_per_s": csd_steps * (bx + bc) / csd_s,
        "classifier_steps_per_s": cls_steps / cls_s,
        "csd_max_rel_diff_vs_1_device": float(np.max(np.abs(v - ref)) / np.max(np.abs(ref))),
    }
    rows.append(row)
    log(
        f"devices {n}: CSD {row['csd_steps_per_s']:.1f} steps/s, classifier "
        f"{row['classifier_steps_per_s']:.1f} steps/s, CSD variance vs 1 device "
        f"{row['csd_max_rel_diff_vs_1_device']:.1e}"
    )
  return rows


def cost_vs_n(images, queries, ns, max_seconds: float, seed: int) -> list:
  """Closed form (whole: Gram + Cholesky + queries) vs one CSD step, for each N."""

  cfg = methods.config_for("csd", CSD_OVERRIDES)
  model = methods.csd_model(cfg)
  key = jax.random.PRNGKey(seed)
  rows, last = [], None
  for n in ns:
    x = throughput.grow(images, n, seed)
    state = csd.init(model, key, x)
    row = {"n": n}
    bx, bc = int(cfg["batch_size"]), int(cfg["context_batch_size"])
    # one step on inputs (the prior's forward pass included, as with on-the-fly augmentation;
    # fitting.fit's matched path runs it once per input instead): independent of N
    t, _ = _timed(
        lambda: fitting.train_chunk(
            model, state, key, jax.numpy.uint32(0), x, None, None, bx, bc, 0.5, 10, None, False
        )
    )
    row["csd_step_seconds"] = t / 10
    if last is not None and last[1] * (n / last[0]) ** 3 > max_seconds:
      row["closed_form_skipped"] = f"predicted {last[1] * (n / last[0]) ** 3:.0f} s > limit"
    else:
      full = jax.jit(
          functools.partial(throughput.closed_form_variance, model.prior, state.prior_params)
      )
      t, _ = _timed(full, x, queries)
      row["closed_form_seconds"] = t
      last = (n, t)
    rows.append(row)
    log(
        f"N={n}: one CSD step {row['csd_step_seconds'] * 1e3:.1f} ms, closed form "
        f"{row.get('closed_form_seconds', float('nan')):.2f} s"
    )
  return rows


def plot(result: dict, path: str) -> None:
  """scaling.png: steps/s against the device count, and seconds against N."""
  plt = protocol.setup_matplotlib()
  fig, ax = plt.subplots(1, 2, figsize=(10, 3.8))
  d = result["devices"]
  ax[0].plot([r["devices"] for r in d], [r["csd_steps_per_s"] for r in d], "o-", label="CSD fit")
  ax[0].plot(
      [r["devices"] for r in d],
      [r["classifier_steps_per_s"] for r in d],
      "s-",
      label="classifier fit",
  )
  ax[0].set_xscale("log", base=2)
  ax[0].set_xlabel(
      f"devices ({result['platform']}" f"{', simulated' if result['simulated'] else ''})"
  )
  ax[0].set_ylabel("training steps / s")
  c = result["cost_vs_n"]
  cf = [r for r in c if "closed_form_seconds" in r]
  ax[1].loglog(
      [r["n"] for r in cf],
      [r["closed_form_seconds"] for r in cf],
      "o-",
      label="closed form (Gram + Cholesky + queries)",
  )
  ax[1].loglog(
      [r["n"] for r in c],
      [r["csd_step_seconds"] for r in c],
      "s-",
      color="C3",
      label="one CSD step",
  )
  ax[1].set_xlabel("N training points")
  ax[1].set_ylabel("seconds")
  for a in ax:
    a.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def run(
    config: ml_collections.ConfigDict, out_dir: str, device_counts=(), simulated: bool = False
) -> dict:
  """Both panels for ``config`` (configs/scaling.py) on meshes of ``device_counts`` devices
  (default 1, 2, 4, … up to all; ``simulated``: they are split CPU cores); writes scaling.json
  and scaling.png to ``out_dir``."""
  check_config(config)
  os.makedirs(out_dir, exist_ok=True)
  total = jax.device_count()
  counts = list(device_counts) or [2**i for i in range(total.bit_length()) if 2**i <= total]
  if max(counts) > total:
    raise app.UsageError(f"--device_counts asks for {max(counts)} devices, {total} visible")
  mnist = data.mnist5k()
  images = jnp.asarray(mnist.images[: config.num_train])
  queries = jnp.asarray(mnist.images[4000 : 4000 + config.num_queries])
  result = {
      "platform": jax.default_backend(),
      "device_count": total,
      "simulated": simulated,
      "devices": device_scaling(
          images, queries, counts, config.csd_steps, config.classifier_steps, config.seed
      ),
      "cost_vs_n": cost_vs_n(
          mnist.images, queries, list(config.ns), config.max_closed_form_seconds, config.seed
      ),
      "config": cli.to_dict(config),
      "note": "simulated CPU devices share the host's cores: device-count throughput "
      "there checks the code path, not a speed-up",
  }
  train.write_json(os.path.join(out_dir, "scaling.json"), result)
  plot(result, os.path.join(out_dir, "scaling.png"))
  log(f"wrote {out_dir}/scaling.json and scaling.png")
  return result


def main(argv, config: ml_collections.ConfigDict):
  if FLAGS.simulated_devices:
    # Read when JAX starts its CPU backend, at the first device query (nothing before this
    # line touched a device).
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_"
        f"device_count={FLAGS.simulated_devices}"
    ).strip()
    jax.config.update("jax_platforms", "cpu")
  cli.start(argv, config, FLAGS.out_dir, NAME, check_config)
  run(
      config,
      FLAGS.out_dir,
      [int(c) for c in FLAGS.device_counts],
      simulated=bool(FLAGS.simulated_devices),
  )


if __name__ == "__main__":
  config_flag = define_flags()
  cli.run(lambda argv: main(argv, config_flag.value))
