"""One cell of the OOD benchmark: a (method, task, seed) fit, scored and saved, or reused.

A cell writes ``cells/<method>/<task>_seed<k>.json`` (its record) and ``.npz`` (its scores), and
checkpoints the fitted state (orbax) under ``checkpoints/<method>/<task>_seed<k>``. ``run_cell``
loads a finished cell whose config and sets are unchanged, restores a checkpointed state
instead of refitting when only the scoring was lost, and computes the rest.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
import zlib

import jax
import ml_collections
import numpy as np

from benchmarks import protocol
from cmdline import cli
from csd_jax import checkpoint
from uncertainty_kit import data
from uncertainty_kit import methods
from uncertainty_kit import metrics
from uncertainty_kit import train
from uncertainty_kit.interface import MethodState


def cell_id(task: str, seed: int, split: str = "eval") -> str:
  """A cell's file stem; tune cells get their own (``split`` does not change the fit)."""
  return f"{task}_seed{seed}" if split == "eval" else f"{task}_{split}_seed{seed}"


def task_key(seed: int, task: str) -> jax.Array:
  """The fit's PRNG key of one (task, seed): every method of a cell starts from it."""
  return jax.random.fold_in(jax.random.PRNGKey(seed), zlib.crc32(task.encode()))


def config_hash(config) -> str:
  """A short hash of a method config (a cell or checkpoint made under another is redone)."""
  text = json.dumps(cli.to_dict(config), sort_keys=True)
  return checkpoint.fingerprint(np.frombuffer(text.encode(), np.uint8))


def load_tasks(config: ml_collections.ConfigDict, seed: int) -> list[protocol.Task]:
  """The tasks of one seed under ``config`` (``configs/ood.py``): dataset, caps, tfds sets.

  Raises ``data.DatasetNotFoundError`` when a tfds set is not prepared."""
  if config.dataset == "embedded":
    return protocol.embedded_tasks(seed, config.num_test, config.max_train, config.max_test)
  family = data.load_family(
      cli.split_list(config.family),
      data_dir=config.data_dir,
      notmnist_path=config.notmnist_path,
      download=config.download,
      seed=seed,
  )
  return protocol.family_tasks(family, seed, config.max_train, config.max_test)


def extra_score_kinds(name: str, config) -> list[str]:
  """The output-variance score kinds (``Method.output_variance_scores``) other than the cell's
  own ``score``: each cell also records its AUROC under these (same fitted state)."""
  kinds = methods.get(name).output_variance_scores or ()
  return sorted(k for k in kinds if k != config.get("score"))


def fit_hash(name: str, config, task: protocol.Task, seed: int) -> str:
  """A short hash of everything that changes a cell's fit: the method config, the training
  set, the context set (methods that read it) and the key. A fit saved under another is redone."""
  uses_context = methods.get(name).uses_context
  text = json.dumps(
      {
          "config": config_hash(config),
          "key": checkpoint.key_id(task_key(seed, task.name)),
          "train": checkpoint.fingerprint(task.train.images, task.train.labels),
          "context": checkpoint.fingerprint(task.context) if uses_context else None,
      },
      sort_keys=True,
  )
  return checkpoint.fingerprint(np.frombuffer(text.encode(), np.uint8))


def _ckpt_hash(ckpt_path: str) -> str | None:
  try:
    with open(ckpt_path + ".config.json") as f:
      return json.load(f)["fit_hash"]
  except (OSError, ValueError, KeyError):
    return None


def _load_finished(
    json_path: str, npz_path: str, fhash: str, extra: list[str], sizes: dict
) -> dict | None:
  """A finished cell's record if it was made from the same fit (``fit_hash``: config, data,
  contexts, key), scores and set sizes (the sizes catch a cell scored under another protocol:
  other sets or splits)."""
  if not (os.path.exists(json_path) and os.path.exists(npz_path)):
    return None
  with open(json_path) as f:
    record = json.load(f)
  if (
      record.get("fit_hash") == fhash
      and sorted(record.get("by_score", {})) == extra
      and all(record.get(k) == v for k, v in sizes.items())
  ):
    return record
  print(
      f"\n{json_path}: config, data, contexts, scores or sets changed, recomputing", file=sys.stderr
  )
  return None


def fit_or_restore(
    name: str,
    config,
    task: protocol.Task,
    seed: int,
    ckpt_path: str,
    *,
    mesh=None,
    checkpoint_every: int = 0,
) -> tuple[MethodState, str, float | None]:
  """The fitted state of one cell: restored from ``ckpt_path`` when it holds a fit of the same
  ``fit_hash``, else fitted (mid-fit checkpoints every ``checkpoint_every`` steps under
  ``<ckpt_path>.partial``) and saved there. Returns (state, "restored" | "computed", fit
  seconds or None); a network the fit shares with an earlier one (``train.cached_classifier``)
  counts at its training time."""
  method = methods.get(name)
  chash = fit_hash(name, config, task, seed)
  if checkpoint.exists(ckpt_path) and _ckpt_hash(ckpt_path) == chash:
    return MethodState(arrays=checkpoint.restore_pytree(ckpt_path), config=config), "restored", None
  t0, reused0 = time.perf_counter(), train.reused_seconds()
  run = train.RunOptions(
      mesh=mesh,
      checkpoint_dir=f"{ckpt_path}.partial/{chash}" if checkpoint_every else None,
      checkpoint_every=checkpoint_every,
  )
  state = method.fit(
      task_key(seed, task.name),
      task.train,
      config,
      context=task.context if method.uses_context else None,
      run=run,
  )
  jax.block_until_ready(state.arrays)
  # The fit's own cost: shared networks another method trained first count at their training time.
  fit_seconds = time.perf_counter() - t0 + train.reused_seconds() - reused0
  checkpoint.save_pytree(ckpt_path, state.arrays)
  train.write_json(ckpt_path + ".config.json", {"fit_hash": chash})
  shutil.rmtree(f"{ckpt_path}.partial", ignore_errors=True)  # the finished state replaces it
  return state, "computed", fit_seconds


def run_cell(
    name: str,
    config,
    task: protocol.Task,
    seed: int,
    out_dir: str,
    *,
    mesh=None,
    checkpoint_dir: str | None = None,
    checkpoint_every: int = 0,
    split: str = "eval",
) -> dict:
  """Computes (or loads) one (method, task, seed) cell; returns its record.

  ``config``: the method's frozen config (``ml_collections.FrozenConfigDict``). ``mesh``: fit
  data-parallel over it; ``checkpoint_every`` > 0: the fit checkpoints every so many steps and a
  rerun resumes it mid-way. ``checkpoint_dir``: where fitted states go (default
  ``out_dir/checkpoints``). ``split``: "eval" scores ``task.test`` and ``task.ood_eval``;
  "tune" scores ``task.tune`` and ``task.ood_tune`` (own cell files; the fit, and so its
  checkpoint, is the same for both). The record's ``status``: "loaded", "restored" (the fit
  came from its checkpoint) or "computed".
  """
  method = methods.get(name)
  cid = cell_id(task.name, seed, split)
  test, oods = (task.test, task.ood_eval) if split == "eval" else (task.tune, task.ood_tune)
  json_path = os.path.join(out_dir, "cells", name, f"{cid}.json")
  npz_path = os.path.join(out_dir, "cells", name, f"{cid}.npz")
  chash = config_hash(config)
  fhash = fit_hash(name, config, task, seed)
  extra = extra_score_kinds(name, config)
  sizes = {
      "num_test": len(test.labels),
      "num_ood_eval": {k: len(v.labels) for k, v in oods.items()},
  }
  record = _load_finished(json_path, npz_path, fhash, extra, sizes)
  if record is not None:
    record["status"] = "loaded"
    return record
  ckpt_path = os.path.join(
      checkpoint_dir or os.path.join(out_dir, "checkpoints"), name, cell_id(task.name, seed)
  )
  state, status, fit_seconds = fit_or_restore(
      name, config, task, seed, ckpt_path, mesh=mesh, checkpoint_every=checkpoint_every
  )
  score = jax.jit(method.score)
  predict = jax.jit(method.predict)
  t1 = time.perf_counter()
  scores = {"__id__": protocol.batched(lambda x: score(state, x), test.images)}
  for ood_name, ds in oods.items():
    scores[ood_name] = protocol.batched(lambda x: score(state, x), ds.images)
  probs = protocol.batched(lambda x: predict(state, x), test.images)
  score_seconds = time.perf_counter() - t1
  per_pair = {f"{task.name}:{o}": metrics.ood_metrics(scores["__id__"], scores[o]) for o in oods}
  by_score = {}  # the same fitted state under other score functionals: AUROC per pair
  for kind in extra:
    other = MethodState(arrays=state.arrays, config=cli.replace(config, score=kind))
    sid = protocol.batched(lambda x: score(other, x), test.images)
    by_score[kind] = {
        f"{task.name}:{o}": metrics.ood_metrics(
            sid, protocol.batched(lambda x: score(other, x), ds.images)
        )["auroc"]
        for o, ds in oods.items()
    }
  record = {
      "method": name,
      "task": task.name,
      "seed": seed,
      "split": split,
      "config_hash": chash,
      "fit_hash": fhash,
      "config": cli.to_dict(config),
      "acc": metrics.accuracy(probs, test.labels),
      "per_pair": per_pair,
      "by_score": by_score,
      "fit_seconds": fit_seconds,
      "score_seconds": score_seconds,
      "num_train": int(len(task.train.labels)),
      "num_test": int(len(test.labels)),
      "num_ood_eval": {k: int(len(v.labels)) for k, v in oods.items()},
      "num_context": int(len(task.context)) if method.uses_context else 0,
  }
  os.makedirs(os.path.dirname(npz_path), exist_ok=True)
  tmp = npz_path + ".tmp.npz"
  np.savez(tmp, **scores)
  os.replace(tmp, npz_path)
  train.write_json(json_path, record)
  record["status"] = status
  return record
