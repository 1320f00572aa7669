r"""Cost of uncertainty: CSD against ensembles, MC dropout and the exact closed form.

    python -m benchmarks.throughput --out_dir=out/throughput
    python -m benchmarks.throughput --config=configs/throughput.py:quick --out_dir=/tmp/tp   # tiny

The experiment (sizes, budgets, repeats) is ``configs/throughput.py``, overridden with
``--config.<field>=value``.

In one run, on one machine, on the same query batch (``--config.batch_size`` ID test images):

* inference: samples/s and peak memory of the uncertainty score of CSD (default towers, and free
  towers), ENS(M) for M in ``--config.ensemble_sizes`` (3 and 15 at least), MC dropout (k
  passes), last-layer Laplace, RND, and the exact closed-form NTK-GP variance of CSD's label kernel Θ_L over
  the N training points (Cholesky precomputed; per query Θ(x, X) and a triangular solve).
  Memory is XLA's compiled memory analysis (arguments + outputs + temporaries) of the jitted score
  — one measure on every backend; CPU has no allocator statistics.
* training wall-clock (compiled steps, compile time excluded by a warm-up): CSD's g (matched and
  free towers), one ensemble member, ENS(15) (``train.train_ensemble``, vmapped on accelerators,
  sequential on CPU).
* scaling: time and memory of the closed form vs N (training sets grown with augmentations past
  the 4,000 digits) until it passes ``--config.scaling.max_seconds`` or
  ``--config.scaling.max_bytes``, against CSD's wall-clock to reach Spearman ≥
  ``--config.scaling.target_spearman`` with that closed form on the queries.

Writes ``throughput.json`` (ratios ``csd_vs_ens15_inference_speedup``,
``csd_vs_ens15_train_speedup``, raw rows), ``cost_vs_ensemble_size.png``, ``scaling.png``.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time
from typing import Any, NamedTuple

from absl import flags
import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import ml_collections
import numpy as np
from scipy import stats

from benchmarks import protocol
from cmdline import cli
from csd_jax import csd
from csd_jax import fitting
from csd_jax import models
from csd_jax import posterior
from uncertainty_kit import augment
from uncertainty_kit import defaults
from uncertainty_kit import methods
from uncertainty_kit import scores
from uncertainty_kit import train

FLAGS = flags.FLAGS
NAME = "throughput"


def define_flags() -> flags.FlagHolder:
  """``--out_dir`` and ``--config`` (configs/throughput.py); returns the config's flag holder.

  Called under ``__main__`` only, never at import: a second binary imported into the same
  process would otherwise hit absl's ``DuplicateFlagError``.
  """
  return cli.define_out_dir_and_config(NAME)


def check_config(config: ml_collections.ConfigDict) -> None:
  """Raises ``cli.ConfigError`` naming the first field out of range."""
  cli.check(
      config,
      non_negative=("seed",),
      positive=(
          "max_train",
          "batch_size",
          "repeats",
          "rounds",
          "mc_passes",
          "train_steps",
          "csd_steps",
          "scaling.max_seconds",
          "scaling.max_bytes",
          "scaling.csd_chunk",
          "scaling.csd_max_steps",
      ),
      open_unit_interval=("scaling.target_spearman",),
  )
  for path in ("ensemble_sizes", "scaling.ns"):
    values = cli.lookup(config, path)
    if not values or not all(isinstance(v, int) and v > 0 for v in values):
      raise cli.ConfigError(
          f"--config.{path} must be a list of positive integers, " f"got {values!r}"
      )


def closed_form(spec, prior_params, x_train, diag_reg=1e-3):
  """The exact NTK-GP variance of Θ_L over ``x_train``: (factor, query fn)."""
  feats = models.batched_last_layer_features(spec, prior_params, x_train)
  f = posterior.factor(feats @ feats.T, diag_reg)

  def query(x):
    phi = models.last_layer_features(spec, prior_params, x)
    a = jsl.solve_triangular(f.lower, (phi @ feats.T).T, lower=True)
    return jnp.maximum(jnp.sum(phi * phi, -1) - jnp.sum(a * a, axis=0), 0.0)

  return feats, f, query


def closed_form_variance(spec, prior_params, x_train, xq, diag_reg: float = 1e-3):
  """The whole closed form in one jittable call: Θ_L Gram over ``x_train`` (N, ...), its
  Cholesky, and the variance at ``xq`` (B, ...): O(N²) memory, O(N³) time. Returns (B,)."""
  feats = models.last_layer_features(spec, prior_params, x_train)
  f = posterior.factor(feats @ feats.T, diag_reg, check=False)
  phi = models.last_layer_features(spec, prior_params, xq)
  a = jsl.solve_triangular(f.lower, (phi @ feats.T).T, lower=True)
  return jnp.maximum(jnp.sum(phi * phi, -1) - jnp.sum(a * a, axis=0), 0.0)


def grow(x_train: np.ndarray, n: int, seed: int = 0) -> jnp.ndarray:
  """n training inputs: the digits, then augmentations of them (default CSD-Aug pipeline)."""
  x = jnp.asarray(x_train)
  parts, have, key = [x[:n]], min(n, x.shape[0]), jax.random.PRNGKey(seed)
  aug = jax.jit(augment.default_augmentation)
  while have < n:
    key, sub = jax.random.split(key)
    take = min(n - have, x.shape[0])
    parts.append(aug(sub, x[:take]))
    have += take
  return jnp.concatenate(parts)


class Inputs(NamedTuple):
  """What every measurement of a run shares: the task, its training inputs (N, 28, 28, 1), the
  query batch (B, 28, 28, 1), the key, the per-network budget and the ensemble sizes."""

  task: protocol.Task
  x_train: jax.Array
  batch: jax.Array
  key: jax.Array
  steps: int  # training steps per network
  sizes: list[int]  # ensemble sizes M, 3 and 15 included
  over: dict  # method-config overrides: the per-network budget


def inputs(config: ml_collections.ConfigDict) -> Inputs:
  """The task, query batch and budget of ``config`` (configs/throughput.py)."""
  task = protocol.embedded_tasks(config.seed, max_train=config.max_train)[0]
  steps = config.train_steps or defaults.TRAIN["num_steps"]
  return Inputs(
      task=task,
      x_train=jnp.asarray(task.train.images),
      batch=jnp.asarray(np.concatenate([task.test.images] * 4)[: config.batch_size]),
      key=jax.random.PRNGKey(config.seed),
      steps=steps,
      sizes=sorted(set(config.ensemble_sizes) | {3, 15}),
      over={"train": {"num_steps": steps}},
  )


def time_classifiers(inp: Inputs, log) -> tuple[dict, Any, Any, str]:
  """Training seconds of one member and of ENS(max M), compile time excluded by a warm-up.

  Returns (seconds by row, the member's params, the ensemble's params (M, ...), its mode)."""
  spec = train.classifier_spec(methods.config_for("ens15"))
  tk = train.train_kwargs(methods.config_for("ens15", inp.over))
  labels = inp.task.train.labels
  rows = {}
  # Warm-up: the compiled step is cached per (spec, budget), so run the identical config once.
  train.train_classifier(jax.random.fold_in(inp.key, 9), spec, inp.x_train, labels, **tk)
  t = time.perf_counter()
  member, _ = train.train_classifier(inp.key, spec, inp.x_train, labels, **tk)
  jax.block_until_ready(member)
  rows["one_member"] = time.perf_counter() - t
  log(f"one member: {rows['one_member']:.1f}s")
  max_m = max(inp.sizes)
  t = time.perf_counter()
  ens_params, info = train.train_ensemble(
      inp.key, spec, inp.x_train, labels, num_members=max_m, **tk
  )
  jax.block_until_ready(ens_params)
  rows[f"ens{max_m}"] = time.perf_counter() - t
  log(f"ens{max_m} ({info['mode']}): {rows[f'ens{max_m}']:.1f}s")
  return rows, member, ens_params, info["mode"]


def time_csd_fit(name: str, csd_steps: int | None, inp: Inputs, member) -> tuple[float, tuple]:
  """Seconds of CSD method ``name``'s g fit (its own fit path, ``csd_jax.fit`` with the config's
  budget, C = X; compiled first); returns (seconds, (config, model, fitted state))."""
  cfg = methods.config_for(name, {} if csd_steps is None else {"num_steps": csd_steps})
  model = methods.csd_model(cfg)
  n = int(cfg["num_steps"])
  # the prior the method uses: the trained classifier (timed as one member) or f at init
  st = csd.init(
      model, inp.key, inp.x_train, prior_params=member if cfg["prior"] == "trained" else None
  )
  fit_kw = {k: v for k, v in methods.csd_fit_kwargs(cfg).items() if k != "num_steps"}

  def fit_g(s, k, steps):
    return fitting.fit(
        model, s, k, inp.x_train, num_steps=steps, log_every=steps, verbose=False, **fit_kw
    )[0]

  jax.block_until_ready(fit_g(st, inp.key, n if name == "csd_matched" else 2))  # compile
  t = time.perf_counter()
  st = fit_g(st, inp.key, n)
  jax.block_until_ready(st)
  return time.perf_counter() - t, (cfg, model, st)


def score_fns(
    config: ml_collections.ConfigDict, inp: Inputs, csd_states: dict, ens_params, ens_mode: str
) -> dict:
  """Every score timed at inference, by row name: ``x (B, ...) -> (B,)``. Fits the methods
  timed at inference only (MC dropout, Laplace, RND) and the closed form's factor."""
  default = f"csd_{defaults.DEFAULT_TOWERS}"
  fns = {}
  for name, (cfg, model, st) in csd_states.items():
    # the method's own score (the deep form's relative 1 − cos runs the towers only)
    fns[name] = (lambda model, st, rel: lambda x: csd.variance(model, st, x, relative=rel)[0])(
        model, st, cfg["score"] == "relative_variance"
    )
  fns["csd"] = fns[default]
  # the deep form's unscaled variance k(x,x)(1 − cos) needs the prior's pass besides the
  # towers: against the relative score, what the towers-only path saves
  _, deep_model, deep_state = csd_states["csd_deep"]
  fns["csd_deep_variance"] = lambda x: csd.variance(deep_model, deep_state, x)[0]
  spec = train.classifier_spec(methods.config_for("ens15"))
  for m in inp.sizes:
    p = jax.tree_util.tree_map(lambda a: a[:m], ens_params)
    fns[f"ens{m}"] = (
        lambda p: lambda x: scores.sample_uncertainty(
            train.ensemble_logits(spec, p, x, ens_mode), "variance"
        )
    )(p)
  key, over, mc_passes = inp.key, inp.over, config.mc_passes
  mc_state = methods.get("mc_dropout").fit(
      key, inp.task.train, methods.config_for("mc_dropout", {**over, "num_passes": mc_passes})
  )
  fns[f"mc_dropout_k{mc_passes}"] = lambda x: methods.get("mc_dropout").score(mc_state, x)
  la_state = methods.get("laplace").fit(key, inp.task.train, methods.config_for("laplace", over))
  fns["laplace"] = lambda x: methods.get("laplace").score(la_state, x)
  rnd_state = methods.get("rnd").fit(key, inp.task.train, methods.config_for("rnd", over))
  fns["rnd"] = lambda x: methods.get("rnd").score(rnd_state, x)
  _, model, st = csd_states[default]
  fns["closed_form"] = closed_form(model.prior, st.prior_params, inp.x_train)[2]
  return fns


def time_inference(fns: dict, batch: jax.Array, rounds: int, repeats: int, log) -> dict:
  """Per score (``"csd"``, an alias, is not timed twice): median seconds per batch over
  ``rounds``, samples/s, and XLA's compiled memory analysis.

  Round-robin over the methods, ``rounds`` times, median per method: a load spike on a shared
  machine then hits every method alike instead of whichever ran during it."""
  jitted = {name: jax.jit(fn) for name, fn in fns.items() if name != "csd"}
  times = {name: [] for name in jitted}
  for _ in range(rounds):
    for name, jf in jitted.items():
      times[name].append(protocol.timed(jf, batch, repeats=repeats))
  rows = {}
  for name in jitted:
    t = float(np.median(times[name]))
    row = {
        "seconds_per_batch": t,
        "samples_per_s": batch.shape[0] / t,
        "rounds_seconds": times[name],
        "memory_bytes": protocol.compiled_memory_bytes(fns[name], batch),
    }
    rows[name] = row
    log(f"inference {name}: {row['samples_per_s']:.0f}/s, peak {row['memory_bytes']['peak']}")
  return rows


def fidelity(fns: dict, batch: jax.Array, num_train: int) -> dict:
  """Spearman ρ of CSD's score against the closed form on the query batch."""
  cf_v = np.asarray(fns["closed_form"](batch))
  csd_v = np.asarray(fns["csd"](batch))
  return {
      "spearman_csd_vs_closed_form": float(stats.spearmanr(csd_v, cf_v)[0]),
      "closed_form_diag_reg": 1e-3,
      "num_train": num_train,
  }


def summarize(
    inp: Inputs, repeats: int, ens_mode: str, rows_inf: dict, rows_train: dict, fid: dict
) -> dict:
  """The summary's measured part: device, budget, the CSD vs ENS(15) ratios and the rows."""
  return {
      "device": str(jax.devices()[0]),
      "backend": jax.default_backend(),
      "batch_size": int(inp.batch.shape[0]),
      "repeats": repeats,
      "train_steps_per_network": inp.steps,
      "ensemble_mode": ens_mode,
      "csd_vs_ens15_inference_speedup": rows_inf["csd"]["samples_per_s"]
      / rows_inf["ens15"]["samples_per_s"],
      "csd_vs_ens15_train_speedup": rows_train["ens15"] / rows_train["csd"],
      "csd_vs_ens15_train_speedup_including_classifier": rows_train["ens15"]
      / rows_train["csd_including_classifier"],
      "csd_train_over_one_member": rows_train["csd"] / rows_train["one_member"],
      "csd_vs_ens15_memory_ratio": (
          rows_inf["ens15"]["memory_bytes"]["peak"] / rows_inf["csd"]["memory_bytes"]["peak"]
      ),
      "default_towers": defaults.DEFAULT_TOWERS,
      "inference": rows_inf,
      "train_seconds": rows_train,
      "csd_fidelity": fid,
  }


def run(config: ml_collections.ConfigDict, out_dir: str) -> dict:
  """Measures the costs of ``config`` (configs/throughput.py); writes throughput.json and the
  plots to ``out_dir``; returns the summary."""
  check_config(config)
  os.makedirs(out_dir, exist_ok=True)
  t_start = time.perf_counter()
  log = lambda msg: print(
      f"[{time.perf_counter() - t_start:6.0f}s] {msg}", file=sys.stderr, flush=True
  )
  inp = inputs(config)

  # Training wall-clock (warm-ups first, so compile time is excluded).
  rows_train, member, ens_params, ens_mode = time_classifiers(inp, log)
  csd_states = {}
  for name in ("csd_matched", "csd_deep"):
    rows_train[name], csd_states[name] = time_csd_fit(name, config.csd_steps, inp, member)
    log(f"{name} g ({int(csd_states[name][0]['num_steps'])} steps): {rows_train[name]:.1f}s")
  default = f"csd_{defaults.DEFAULT_TOWERS}"
  rows_train["csd"] = rows_train[default]
  rows_train["csd_including_classifier"] = rows_train[default] + rows_train["one_member"]

  # Inference on the same batch.
  fns = score_fns(config, inp, csd_states, ens_params, ens_mode)
  rows_inf = time_inference(fns, inp.batch, config.rounds, config.repeats, log)
  rows_inf["csd"] = rows_inf[default]
  fid = fidelity(fns, inp.batch, int(inp.x_train.shape[0]))
  summary = summarize(inp, config.repeats, ens_mode, rows_inf, rows_train, fid)

  plt = protocol.setup_matplotlib()
  plot_cost_vs_ensemble_size(
      plt,
      summary,
      inp.sizes,
      config.mc_passes,
      os.path.join(out_dir, "cost_vs_ensemble_size.png"),
  )
  summary["plots"] = ["cost_vs_ensemble_size.png"]
  # Scaling: closed form vs N against CSD's cost to a fixed accuracy.
  if config.scaling.enabled:
    summary["scaling"] = scaling(inp.task, inp.batch, log, config.scaling, config.seed)
    summary["plots"].append("scaling.png")
    _plot_scaling(plt, summary["scaling"], os.path.join(out_dir, "scaling.png"))
  summary["config"] = cli.to_dict(config)
  summary["wall_seconds"] = time.perf_counter() - t_start
  train.write_json(os.path.join(out_dir, "throughput.json"), summary)
  print(json.dumps({k: v for k, v in summary.items() if not isinstance(v, dict)}, indent=1))
  print(f"wrote {out_dir}/throughput.json")
  return summary


def plot_cost_vs_ensemble_size(plt, summary: dict, sizes: list[int], mc_passes: int, path: str):
  """Inference samples/s, peak memory and training seconds against the ensemble size M, with
  CSD (and MC dropout) as lines; saved to ``path``."""
  rows_inf, rows_train = summary["inference"], summary["train_seconds"]
  max_m = max(sizes)
  fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
  ms = np.array(sizes)
  axes[0].plot(ms, [rows_inf[f"ens{m}"]["samples_per_s"] for m in sizes], "o-", label="ENS(M)")
  axes[0].axhline(rows_inf["csd"]["samples_per_s"], color="C3", label="CSD")
  axes[0].axhline(
      rows_inf[f"mc_dropout_k{mc_passes}"]["samples_per_s"],
      color="C2",
      ls="--",
      label=f"MC dropout k={mc_passes}",
  )
  axes[0].set_ylabel("inference samples/s")
  axes[1].plot(
      ms, [rows_inf[f"ens{m}"]["memory_bytes"]["peak"] / 2**20 for m in sizes], "o-", label="ENS(M)"
  )
  axes[1].axhline(rows_inf["csd"]["memory_bytes"]["peak"] / 2**20, color="C3", label="CSD")
  axes[1].set_ylabel("peak memory, MiB (XLA analysis)")
  axes[2].plot(ms, ms * rows_train["one_member"], "o-", label="ENS(M) ≈ M × one member")
  axes[2].plot(
      [max_m], [rows_train[f"ens{max_m}"]], "s", color="C0", label=f"ENS({max_m}) measured"
  )
  axes[2].axhline(rows_train["csd"], color="C3", label="CSD (g)")
  axes[2].axhline(
      rows_train["csd_including_classifier"], color="C3", ls=":", label="CSD + classifier"
  )
  axes[2].set_ylabel("training wall-clock, s")
  for ax in axes:
    ax.set_xlabel("ensemble size M")
    ax.set_yscale("log")
    ax.legend(fontsize=7)
  fig.suptitle(f"Cost vs ensemble size ({summary['backend']}, batch {summary['batch_size']})")
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def scaling(task, queries, log, config: ml_collections.ConfigDict, seed: int) -> dict:
  """The closed form's time and memory against N, next to CSD's time to reach
  ``config.target_spearman`` with it; ``config`` is the config's ``scaling``."""
  ns = list(config.ns)
  cfg = methods.config_for("csd_matched")
  model = methods.csd_model(cfg)
  key = jax.random.PRNGKey(seed + 1)
  chunk = config.csd_chunk
  rows, last = [], None
  for n in ns:
    row = {"n": n}
    gram_bytes = 2 * 4 * n * n
    if gram_bytes > config.max_bytes:
      row["closed_form"] = {"skipped": f"Gram+factor {gram_bytes / 1e9:.1f} GB > limit"}
      rows.append(row)
      log(f"scaling N={n}: closed form skipped (memory)")
      continue
    if last is not None and last[1] * (n / last[0]) ** 3 > config.max_seconds:
      row["closed_form"] = {"skipped": f"predicted {last[1] * (n / last[0]) ** 3:.0f}s > limit"}
      rows.append(row)
      log(f"scaling N={n}: closed form skipped (time)")
      continue
    x = grow(task.train.images, n)
    st = csd.init(model, key, x)

    full = functools.partial(closed_form_variance, model.prior, st.prior_params)
    jfull = jax.jit(full)
    t = time.perf_counter()
    ref = np.asarray(jax.block_until_ready(jfull(x, queries)))
    first = time.perf_counter() - t
    t = time.perf_counter()
    ref = np.asarray(jax.block_until_ready(jfull(x, queries)))
    cf_t = time.perf_counter() - t
    mem = protocol.compiled_memory_bytes(full, x, queries)
    row["closed_form"] = {
        "seconds": cf_t,
        "seconds_with_compile": first,
        "memory_bytes": mem["peak"],
    }
    last = (n, cf_t)
    # CSD: train in chunks until Spearman with the closed form reaches the target.
    s = st
    done, t_csd, reached, rho = 0, 0.0, None, None
    var = jax.jit(lambda s, xq: csd.variance(model, s, xq)[0])
    fitting.fit(
        model,
        s,
        key,
        x,
        num_steps=chunk,
        batch_size=int(cfg["batch_size"]),
        log_every=chunk,
        verbose=False,
    )  # compile
    while done < config.csd_max_steps:
      t = time.perf_counter()
      s, _ = fitting.fit(
          model,
          s,
          jax.random.fold_in(key, done),
          x,
          num_steps=chunk,
          batch_size=int(cfg["batch_size"]),
          log_every=chunk,
          verbose=False,
      )
      jax.block_until_ready(s)
      t_csd += time.perf_counter() - t
      done += chunk
      rho = float(stats.spearmanr(np.asarray(var(s, queries)), ref)[0])
      if rho >= config.target_spearman:
        reached = done
        break
    row["csd"] = {
        "seconds": t_csd,
        "steps": done,
        "reached_target": reached is not None,
        "spearman": rho,
        "target_spearman": config.target_spearman,
    }
    rows.append(row)
    log(
        f"scaling N={n}: closed form {cf_t:.2f}s ({mem['peak'] / 2**20:.0f} MiB); CSD "
        f"{t_csd:.2f}s, {done} steps, spearman {rho:.3f}"
    )
  return {
      "rows": rows,
      "queries": int(queries.shape[0]),
      "diag_reg": 1e-3,
      "note": "closed form = Θ_L Gram + Cholesky + solves for the queries; CSD = matched "
      "towers, time to reach the Spearman target with that closed form",
  }


def _plot_scaling(plt, sc, path):
  fig, ax = plt.subplots(1, 2, figsize=(10, 3.8))
  cf = [(r["n"], r["closed_form"]) for r in sc["rows"] if "seconds" in r["closed_form"]]
  cs = [(r["n"], r["csd"]) for r in sc["rows"] if "csd" in r]
  if cf:
    ax[0].loglog([n for n, _ in cf], [c["seconds"] for _, c in cf], "o-", label="closed form")
    ax[1].loglog(
        [n for n, _ in cf], [c["memory_bytes"] / 2**20 for _, c in cf], "o-", label="closed form"
    )
  if cs:
    ax[0].loglog(
        [n for n, _ in cs],
        [c["seconds"] for _, c in cs],
        "s-",
        color="C3",
        label=f"CSD to Spearman ≥ {sc['rows'][0].get('csd', {}).get('target_spearman')}",
    )
  ax[0].set_xlabel("N training points")
  ax[0].set_ylabel("seconds")
  ax[1].set_xlabel("N training points")
  ax[1].set_ylabel("peak memory, MiB")
  for a in ax:
    a.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def main(argv, config: ml_collections.ConfigDict):
  cli.start(argv, config, FLAGS.out_dir, NAME, check_config)
  run(config, FLAGS.out_dir)


if __name__ == "__main__":
  config_flag = define_flags()
  cli.run(lambda argv: main(argv, config_flag.value))
