"""orbax checkpoints: the one place every long run saves and restores its state.

Two kinds:

* **Periodic** checkpoints of a training loop (``Periodic``: the CSD fit, the classifier and
  ensemble fits, the DQN run of ``rl.main``): an orbax ``CheckpointManager`` keeping the two
  newest steps. orbax writes each step to a temporary folder and renames it when complete, so a
  kill during a save leaves the previous checkpoint intact; a checkpoint damaged later
  (truncated or corrupted files) fails to restore, is moved aside to ``corrupt_checkpoints/``
  with a warning, and the next older one is used; a readable one of another state (written by
  other code) stops the run with ``StateMismatchError`` and stays. Each checkpoint carries an
  *identity* (the run's configuration, as JSON): resuming with a different one is an error,
  never a silent mix.
* **One-off** pytrees (``save_pytree`` / ``restore_pytree``): a finished method state of the OOD
  benchmark's cells.

A loop resumed from a checkpoint ends with the same parameters, bitwise on CPU, as an
uninterrupted one, because every step's PRNG key depends on the step index only (see
``fitting.fit``, ``train.fit_loop``).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

PyTree = Any


def jsonable(obj: Any) -> Any:
  """``obj`` as plain JSON values (what a checkpoint's meta holds); other objects via ``describe``."""
  return json.loads(json.dumps(obj, default=describe, sort_keys=True))


def describe(obj: Any) -> str:
  """A text that names everything ``obj`` computes with, stable across processes.

  ``repr`` is not enough: an optax transform's repr shows only closure names, so
  ``optax.adam(1e-3)`` and ``optax.adam(1e-4)`` would describe alike. Functions are described
  by their qualified name, a hash of their code, their defaults and the values they close
  over (recursively: a schedule inside ``scale_by_learning_rate`` inside ``chain``);
  dataclasses, named tuples and containers field by field; arrays by ``fingerprint``; other
  objects by ``repr`` without memory addresses.
  """
  return _describe(obj, set())


def _describe(obj: Any, seen: set) -> str:
  if isinstance(obj, (str, int, float, bool, complex, type(None))):
    return repr(obj)
  if isinstance(obj, (np.ndarray, jax.Array, np.generic)):
    return f"array{tuple(np.shape(obj))}:{fingerprint(obj)}"
  if id(obj) in seen:  # a function closing over itself, a cyclic container
    return "<cycle>"
  seen = seen | {id(obj)}
  if isinstance(obj, functools.partial):
    args = [_describe(a, seen) for a in obj.args]
    args += [f"{k}={_describe(v, seen)}" for k, v in sorted(obj.keywords.items())]
    return f"partial({_describe(obj.func, seen)}, {', '.join(args)})"
  if isinstance(obj, dict):
    return (
        "{"
        + ", ".join(
            f"{_describe(k, seen)}: {_describe(v, seen)}"
            for k, v in sorted(obj.items(), key=lambda kv: repr(kv[0]))
        )
        + "}"
    )
  if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # NamedTuple (optax transforms)
    return (
        type(obj).__name__
        + "("
        + ", ".join(f"{f}={_describe(getattr(obj, f), seen)}" for f in obj._fields)
        + ")"
    )
  if isinstance(obj, (list, tuple, set, frozenset)):
    items = sorted(obj, key=repr) if isinstance(obj, (set, frozenset)) else obj
    return type(obj).__name__ + "(" + ", ".join(_describe(v, seen) for v in items) + ")"
  if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
    fields = [f.name for f in dataclasses.fields(obj) if f.name not in ("parent", "name")]
    return (
        type(obj).__qualname__
        + "("
        + ", ".join(f"{f}={_describe(getattr(obj, f), seen)}" for f in fields)
        + ")"
    )
  fn = getattr(obj, "__wrapped__", obj)  # jax.jit / functools.wraps
  code = getattr(fn, "__code__", None)
  if code is not None:
    parts = [f"code={_code_hash(code)}"]
    if fn.__defaults__:
      parts.append(f"defaults={_describe(fn.__defaults__, seen)}")
    if fn.__kwdefaults__:
      parts.append(f"kwdefaults={_describe(fn.__kwdefaults__, seen)}")
    for name, cell in zip(code.co_freevars, fn.__closure__ or ()):
      try:
        value = cell.cell_contents
      except ValueError:  # an empty cell
        value = "<empty>"
      parts.append(f"{name}={_describe(value, seen)}")
    return f"{fn.__module__}.{fn.__qualname__}({', '.join(parts)})"
  return re.sub(r" at 0x[0-9a-fA-F]+", "", repr(obj))


def _code_hash(code) -> str:
  """A short hash of a code object's bytecode and constants (nested code included)."""
  h = hashlib.sha1(code.co_code)
  for c in code.co_consts:
    h.update((_code_hash(c) if hasattr(c, "co_code") else repr(c)).encode())
  return h.hexdigest()[:12]


def fingerprint(*arrays) -> str:
  """A short content hash of numpy/jax arrays (for caching and for resume checks)."""
  h = hashlib.sha1()
  for a in arrays:
    a = np.ascontiguousarray(np.asarray(a))
    h.update(str((a.shape, a.dtype)).encode())
    h.update(a.tobytes())
  return h.hexdigest()[:16]


def key_id(key: jax.Array) -> str:
  """``fingerprint`` of a PRNG key, typed (``jax.random.key``) or raw."""
  if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
    key = jax.random.key_data(key)
  return fingerprint(key)


# ----------------------------------------------------------------------------------------------
# Periodic checkpoints of a loop.
# ----------------------------------------------------------------------------------------------


def manager(directory: str | os.PathLike, max_to_keep: int = 2):
  """An orbax ``CheckpointManager`` over ``directory`` (created), synchronous saves."""
  import orbax.checkpoint as ocp

  return ocp.CheckpointManager(
      Path(directory).absolute(),
      options=ocp.CheckpointManagerOptions(
          max_to_keep=max_to_keep, create=True, enable_async_checkpointing=False
      ),
  )


def save(mngr, step: int, tree: PyTree, meta: dict) -> None:
  """Saves ``tree`` (arrays) and ``meta`` (JSON) as checkpoint ``step``; returns when on disk."""
  import orbax.checkpoint as ocp

  mngr.save(
      step,
      args=ocp.args.Composite(
          state=ocp.args.StandardSave(tree), meta=ocp.args.JsonSave(jsonable(meta))
      ),
      force=True,
  )
  mngr.wait_until_finished()


def restore_latest(mngr, abstract: PyTree) -> tuple[PyTree, dict] | None:
  """The newest readable checkpoint as (tree, meta), or None when there is none.

  ``abstract``: a tree of the same structure (arrays or ``jax.ShapeDtypeStruct``s; their
  shardings are kept). An unreadable checkpoint is moved to ``../corrupt_checkpoints/<step>``
  with a warning and the next older one is tried; if none is readable, ``ValueError`` (the run
  stops rather than silently start over). A readable checkpoint of another state (other arrays,
  shapes or dtypes: written by other code) raises ``StateMismatchError`` and stays in place.
  """
  directory = Path(str(mngr.directory))
  steps = sorted(mngr.all_steps(), reverse=True)
  for step in steps:
    try:
      _leaves_by_path(step, _saved_metadata(mngr, step), abstract)
      tree, meta = _read_step(mngr, step, abstract)
    except StateMismatchError as e:
      raise StateMismatchError(
          f"{directory}: {e}. It was written by other code (or another config) and is left in "
          "place: resume with the code that wrote it, or give this run another checkpoint "
          "folder"
      ) from None
    except Exception as e:  # noqa: BLE001  (orbax / tensorstore raise many kinds)
      aside = directory.parent / "corrupt_checkpoints" / str(step)
      aside.parent.mkdir(parents=True, exist_ok=True)
      if aside.exists():
        shutil.rmtree(aside)
      shutil.move(str(directory / str(step)), str(aside))
      mngr.reload()
      msg = (
          f"WARNING: checkpoint {step} in {directory} is unreadable "
          f"({type(e).__name__}: {str(e)[:200]}); moved it to {aside}, trying an older one"
      )
      logging.getLogger(__name__).warning(msg)
      print(msg, file=sys.stderr, flush=True)
      continue
    return tree, meta
  if steps:
    raise ValueError(
        f"{directory}: none of the checkpoints {steps} is readable (moved to "
        f"{directory.parent / 'corrupt_checkpoints'}); rerun to start afresh"
    )
  return None


def read_latest(directory: str | os.PathLike, abstract: PyTree) -> tuple[PyTree, dict] | None:
  """The newest checkpoint under ``directory`` as (tree, meta), or None when there is none; read
  only: unlike ``restore_latest`` an unreadable one raises and stays where it is (for tools that
  inspect another run's checkpoints while it may still be writing)."""
  if not Path(directory).is_dir():
    return None
  mngr = manager(directory)
  step = mngr.latest_step()
  return None if step is None else _read_step(mngr, step, abstract)


def _read_step(mngr, step: int, abstract: PyTree) -> tuple[PyTree, dict]:
  """Checkpoint ``step`` as (tree, meta); one saved with other containers around the same
  leaves is read leaf by leaf from their paths (``_restore_by_path``)."""
  import orbax.checkpoint as ocp

  try:
    out = mngr.restore(
        step,
        args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()
        ),
    )
  except ValueError as e:
    if "tree structures do not match" not in str(e):
      raise
    return _restore_by_path(mngr, step, abstract)
  return out["state"], out["meta"]


class StateMismatchError(ValueError):
  """A readable checkpoint whose arrays are not the state's (``restore_latest``)."""


def _restore_by_path(mngr, step: int, abstract: PyTree) -> tuple[PyTree, dict]:
  """Checkpoint ``step`` read without a target and each leaf of ``abstract`` taken from its path.

  orbax refuses a target whose tree differs from the saved one only in empty nodes (a field
  that is None, added to a NamedTuple since the save); this accepts such a checkpoint when both
  hold the same leaves, with the same shapes and dtypes, and raises ``StateMismatchError``
  otherwise."""
  import orbax.checkpoint as ocp

  out = mngr.restore(
      step, args=ocp.args.Composite(state=ocp.args.StandardRestore(), meta=ocp.args.JsonRestore())
  )
  flat, treedef = jax.tree_util.tree_flatten_with_path(abstract)
  leaves = []
  for (_, leaf), node in zip(flat, _leaves_by_path(step, out["state"], abstract)):
    sharding = getattr(leaf, "sharding", None)
    leaves.append(jax.device_put(node, sharding) if sharding is not None else jnp.asarray(node))
  return treedef.unflatten(leaves), out["meta"]


def _saved_metadata(mngr, step: int) -> PyTree:
  """The tree of checkpoint ``step``'s array metadata (shape and dtype per saved array)."""
  import orbax.checkpoint as ocp
  # The handler reads it from disk; ``mngr.item_metadata`` is None before this process has
  # saved or restored an item of that name.
  saved = ocp.StandardCheckpointHandler().metadata(Path(str(mngr.directory)) / str(step) / "state")
  return saved.tree


def _leaves_by_path(step: int, saved: PyTree, abstract: PyTree) -> list:
  """The saved leaves (arrays or their metadata) at the paths of ``abstract``'s leaves, in its
  leaf order. ``StateMismatchError`` when the counts differ, a path is missing, or a shape or
  dtype differs: orbax itself would report a shape difference like damage and cast a dtype
  difference silently."""
  flat = jax.tree_util.tree_flatten_with_path(abstract)[0]
  count = len(jax.tree.leaves(saved))
  if count != len(flat):
    raise StateMismatchError(f"checkpoint {step} holds {count} arrays, the state {len(flat)}")
  nodes = []
  for path, leaf in flat:
    node = saved
    try:
      for k in path:  # dicts and NamedTuples are saved as dicts, tuples as lists
        k = getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))
        node = node[k if isinstance(node, list) or k in node else str(k)]
    except (KeyError, IndexError, TypeError) as e:
      raise StateMismatchError(f"checkpoint {step} has no {jax.tree_util.keystr(path)}") from e
    if tuple(node.shape) != tuple(leaf.shape) or jnp.dtype(node.dtype) != jnp.dtype(leaf.dtype):
      raise StateMismatchError(
          f"checkpoint {step}: {jax.tree_util.keystr(path)} is {node.dtype}{list(node.shape)}, "
          f"the state {leaf.dtype}{list(leaf.shape)}"
      )
    nodes.append(node)
  return nodes


class IdentityMismatchError(ValueError):
  """A checkpoint written by a run of other settings (``Periodic.restore``): never resumed."""


def identity_diff(saved: Any, now: Any, prefix: str = "") -> list[str]:
  """The dotted paths at which two identities (JSON values) differ, e.g. ``["model.optimizer"]``."""
  if isinstance(saved, dict) and isinstance(now, dict):
    out = []
    for k in sorted(set(saved) | set(now)):
      path = f"{prefix}.{k}" if prefix else str(k)
      if k not in saved or k not in now:
        out.append(path)
      else:
        out += identity_diff(saved[k], now[k], path)
    return out
  return [] if saved == now else [prefix or "identity"]


class Periodic:
  """Checkpoints of one loop every ``every`` steps in ``directory`` (``None``: does nothing).

  Usage::

      ckpt = Periodic(directory, every, identity={"lr": lr, "data": fingerprint})
      carry, start, meta = ckpt.restore(carry)        # (carry, 0, {}) when nothing saved yet
      for t in range(start, num_steps):
        carry = step(carry, keys[t])
        ckpt.maybe_save(t + 1, carry, num_steps, meta={...})

  The final step is always saved, so a run killed after its loop does not repeat it.
  """

  def __init__(
      self, directory: str | os.PathLike | None, every: int = 0, identity: dict | None = None
  ):
    if every < 0:
      raise ValueError(f"checkpoint_every must be >= 0, got {every}")
    self.directory = None if directory is None else Path(directory)
    self.every = int(every)
    self.identity = jsonable(identity or {})
    self._mngr = None if directory is None else manager(self.directory)

  def restore(self, carry: PyTree) -> tuple[PyTree, int, dict]:
    """(restored carry, step, meta) from the newest readable checkpoint, else (carry, 0, {})."""
    if self._mngr is None:
      return carry, 0, {}
    out = restore_latest(self._mngr, carry)
    if out is None:
      return carry, 0, {}
    tree, meta = out
    if meta.get("identity") != self.identity:
      differ = ", ".join(identity_diff(meta.get("identity"), self.identity)) or "identity"
      raise IdentityMismatchError(
          f"{self.directory}: the checkpoint was written by a run with other {differ}; use "
          "another checkpoint directory, or the same settings"
      )
    return tree, int(meta["step"]), meta.get("extra", {})

  def due(self, step: int, num_steps: int) -> bool:
    """Whether ``maybe_save`` would save at ``step``: a multiple of ``every``, or the last step,
    not saved yet (callers use it to build costly ``meta`` only when needed)."""
    if self._mngr is None:
      return False
    if step != num_steps and not (self.every and step % self.every == 0):
      return False
    return self._mngr.latest_step() != step

  def maybe_save(self, step: int, carry: PyTree, num_steps: int, meta: dict | None = None) -> bool:
    """Saves when ``due(step, num_steps)``; True if it saved."""
    if not self.due(step, num_steps):
      return False
    save(self._mngr, step, carry, dict(identity=self.identity, step=step, extra=meta or {}))
    return True

  def close(self) -> None:
    if self._mngr is not None:
      self._mngr.close()


# ----------------------------------------------------------------------------------------------
# One-off pytrees.
# ----------------------------------------------------------------------------------------------


def save_pytree(path: str, tree: PyTree) -> None:
  """Saves a pytree of arrays (nested dicts) with orbax; the write is atomic (tmp + rename)."""
  import orbax.checkpoint as ocp

  path = os.path.abspath(path)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  ckptr = ocp.StandardCheckpointer()
  ckptr.save(path, jax.tree_util.tree_map(jnp.asarray, tree), force=True)
  ckptr.wait_until_finished()
  ckptr.close()


def restore_pytree(path: str) -> PyTree:
  """Restores what ``save_pytree`` wrote, as nested dicts of jax arrays."""
  import orbax.checkpoint as ocp

  ckptr = ocp.StandardCheckpointer()
  try:
    return ckptr.restore(os.path.abspath(path))
  finally:
    ckptr.close()


def exists(path: str) -> bool:
  """True when ``path`` holds a finished ``save_pytree`` checkpoint."""
  return os.path.isdir(path) and any(
      name in os.listdir(path) for name in ("_CHECKPOINT_METADATA", "_METADATA")
  )
