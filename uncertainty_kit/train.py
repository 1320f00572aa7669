"""Classifier training loops and the shared fit loop (resumable through orbax checkpoints).

Shared by every uncertainty method (``uncertainty_kit.methods``): one backbone (a ``CNNSpec``), one
optax loop, one budget (``num_steps`` × ``batch_size`` examples per network).

Loops are Python loops over a jitted step that samples its own minibatch on device. They are
deliberately *not* a ``lax.scan``: on XLA:CPU a convolution's backward pass inside a loop body
runs ~40× slower than the same step called from Python (jax-ml/jax#12868; docs/results.md).
Forward-only convolutions in a loop are fine.

Ensembles: ``train_ensemble`` trains M members with independent inits and batch orders.
``mode="vmap"`` runs them together, one jitted step vmapped over the stacked parameters (the
right thing on accelerators); ``mode="sequential"`` trains them one after the other with the same
compiled step. XLA:CPU lowers a convolution vmapped over its weights to a grouped convolution that
is 3–10× slower per member than M separate ones, so ``mode="auto"`` picks vmap on accelerators
and sequential on CPU. Both give the same stacked
params for the same key (members are independent either way).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import json
import os
import time
from typing import Any, Callable, Iterable, Mapping

import jax
import jax.numpy as jnp
import numpy as np
import optax

from csd_jax import checkpoint
from csd_jax import models
from csd_jax import parallel
from uncertainty_kit import defaults

Array = jax.Array
PyTree = Any


# ----------------------------------------------------------------------------------------------
# The shared backbone.
# ----------------------------------------------------------------------------------------------


def spec_from_config(
    backbone: Mapping, *, ignore: Iterable[str] = (), **overrides
) -> models.CNNSpec:
  """A ``CNNSpec`` from a config mapping (``{"convs": [[ch, k, stride], ...], "widths": [...],
  ...}``), with ``overrides`` (e.g. ``out_dim``, ``dropout_rate``) applied.

  Every key of ``backbone`` must be a ``CNNSpec`` field, or be named in ``ignore`` (for a
  caller that passes a larger config on purpose): a ``ValueError`` names any other, so a
  misspelt network field fails instead of leaving the default in place."""
  fields = {f.name for f in dataclasses.fields(models.CNNSpec)}
  backbone = dict(backbone)
  unknown = sorted(set(backbone) - fields - set(ignore))
  if unknown:
    raise ValueError(
        f"unknown network field(s) {', '.join(map(repr, unknown))}; "
        f"valid: {', '.join(sorted(fields))}"
    )
  kw = {k: v for k, v in backbone.items() if k in fields}
  kw.update(overrides)
  if "convs" in kw:
    kw["convs"] = tuple(tuple(int(a) for a in c) for c in kw["convs"])
  if "widths" in kw:
    kw["widths"] = tuple(int(w) for w in kw["widths"])
  return models.CNNSpec(**kw)


def classifier_spec(config: Mapping, **overrides) -> models.CNNSpec:
  """The ``defaults.NUM_CLASSES``-way classifier of a method config's ``backbone``."""
  return spec_from_config(config["backbone"], out_dim=defaults.NUM_CLASSES, **overrides)


def train_kwargs(config: Mapping) -> dict:
  """The classifier-training budget of a method config's ``train`` (``defaults.TRAIN``'s
  fields), as ``train_classifier``'s keyword arguments."""
  t = config["train"]
  return dict(
      num_steps=int(t["num_steps"]),
      batch_size=int(t["batch_size"]),
      lr=float(t["lr"]),
      weight_decay=float(t["weight_decay"]),
  )


def spec_to_config(spec: models.CNNSpec) -> dict:
  """The spec's fields as JSON values (tuples become lists)."""
  return json.loads(json.dumps(dataclasses.asdict(spec)))


# ----------------------------------------------------------------------------------------------
# Classifier training.
# ----------------------------------------------------------------------------------------------


def optimizer(lr: float, weight_decay: float, num_steps: int) -> optax.GradientTransformation:
  """AdamW with a cosine decay of the learning rate to 0 over ``num_steps``."""
  schedule = optax.cosine_decay_schedule(lr, max(num_steps, 1))
  return optax.adamw(schedule, weight_decay=weight_decay)


def _classifier_loss(net, params, x, y, key, train):
  logits = net.apply(params, x, deterministic=not train, rngs={"dropout": key})
  return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()


@dataclasses.dataclass(frozen=True)
class RunOptions:
  """How a fit runs, not what it computes: the device mesh and periodic checkpoints.

  mesh: a ``jax.sharding.Mesh`` with a ``"data"`` axis: each step's minibatch is sharded over
    it, params replicated (``csd_jax.parallel``); None: one device.
  checkpoint_dir: where the loop checkpoints (``csd_jax.checkpoint.Periodic``) and resumes
    from; None: no checkpoints. ``sub(name)`` gives a component its own sub-folder.
  checkpoint_every: steps between checkpoints (0: only the final one).

  Results do not depend on these (up to float reassociation of the sharded reductions).
  """

  mesh: Any = None
  checkpoint_dir: str | None = None
  checkpoint_every: int = 0

  def sub(self, name: str) -> "RunOptions":
    if self.checkpoint_dir is None:
      return self
    return dataclasses.replace(self, checkpoint_dir=os.path.join(self.checkpoint_dir, name))

  def periodic(self, identity: Callable[[], dict]) -> checkpoint.Periodic:
    """The loop's ``checkpoint.Periodic``; ``identity()`` (it may hash the data) is only
    called when checkpoints are on."""
    return checkpoint.Periodic(
        self.checkpoint_dir, self.checkpoint_every, identity() if self.checkpoint_dir else None
    )


DEFAULT_RUN = RunOptions()


@functools.lru_cache(maxsize=64)
def _classifier_fns(
    spec: models.CNNSpec,
    lr: float,
    weight_decay: float,
    num_steps: int,
    batch_size: int,
    mesh: Any = None,
):
  """(init(key, x1) -> (params, opt_state), step(carry, key) -> (carry, loss), and their vmaps
  over stacked members), carry = (params, opt_state, images, labels); built once per
  configuration so repeated fits reuse the compiled step. With a mesh the sampled minibatch is
  sharded over its ``"data"`` axis."""
  net = models.module(spec)
  tx = optimizer(lr, weight_decay, num_steps)
  train = spec.dropout_rate > 0

  def init(key, x1):
    params = net.init(key, x1)
    return params, tx.init(params)

  def step(params, opt_state, key, images, labels):
    k_idx, k_drop = jax.random.split(key)
    idx = jax.random.randint(k_idx, (batch_size,), 0, images.shape[0])
    x, y = parallel.constrain_batch(mesh, (images[idx], labels[idx]))
    loss, grads = jax.value_and_grad(lambda p: _classifier_loss(net, p, x, y, k_drop, train))(
        params
    )
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  def carry_step(carry, key):
    params, opt_state, images, labels = carry
    params, opt_state, loss = step(params, opt_state, key, images, labels)
    return (params, opt_state, images, labels), loss

  def vcarry_step(carry, keys):
    params, opt_state, images, labels = carry
    params, opt_state, loss = jax.vmap(step, in_axes=(0, 0, 0, None, None))(
        params, opt_state, keys, images, labels
    )
    return (params, opt_state, images, labels), loss

  return (
      jax.jit(init),
      jax.jit(carry_step),
      jax.jit(jax.vmap(init, in_axes=(0, None))),
      jax.jit(vcarry_step),
  )


def place(run: RunOptions, tree: PyTree) -> PyTree:
  """Replicates ``tree`` over the run's mesh (no-op without one)."""
  if run.mesh is None:
    return tree
  return parallel.replicate(run.mesh, tree)


def train_classifier(
    key: Array,
    spec: models.CNNSpec,
    images: Array,
    labels: Array,
    *,
    num_steps: int,
    batch_size: int,
    lr: float,
    weight_decay: float = 0.0,
    run: RunOptions = DEFAULT_RUN,
) -> tuple[PyTree, dict]:
  """Trains ``module(spec)`` by softmax cross-entropy (with dropout when the spec has it).

  Args:
    key: PRNG key (init and batch order).
    spec: the net; ``out_dim`` = number of classes.
    images: (N, H, W, C) float32. labels: (N,) int32 in [0, out_dim).
    num_steps, batch_size: the budget (num_steps × batch_size examples).
    lr, weight_decay: AdamW with a cosine schedule.
    run: mesh and checkpoints (``RunOptions``); a killed run resumes from its checkpoint.

  Returns:
    (flax params, {"loss": final mean loss over the last 10 % of steps}).
  """
  init, step, _, _ = _classifier_fns(
      spec, float(lr), float(weight_decay), int(num_steps), int(batch_size), run.mesh
  )
  images, labels = jnp.asarray(images), jnp.asarray(labels, jnp.int32)
  k_init, k_loop = jax.random.split(key)
  params, opt_state = init(k_init, images[:1])
  ckpt = run.periodic(
      lambda: dict(
          kind="classifier",
          spec=spec_to_config(spec),
          key=checkpoint.key_id(key),
          data=checkpoint.fingerprint(images, labels),
          num_steps=num_steps,
          batch_size=batch_size,
          lr=lr,
          weight_decay=weight_decay,
      )
  )
  carry = place(run, (params, opt_state, images, labels))
  (params, _, _, _), losses = fit_loop(step, carry, jax.random.split(k_loop, num_steps), ckpt)
  tail = losses[-max(1, num_steps // 10) :]
  return params, {"loss": float(np.mean(tail))}


def resolve_ensemble_mode(mode: str) -> str:
  """``"auto"`` → ``"vmap"`` on accelerators, ``"sequential"`` on CPU (module docstring)."""
  if mode not in ("auto", "vmap", "sequential"):
    raise ValueError(f"ensemble mode must be auto, vmap or sequential, got {mode!r}")
  if mode == "auto":
    return "sequential" if jax.default_backend() == "cpu" else "vmap"
  return mode


def train_ensemble(
    key: Array,
    spec: models.CNNSpec,
    images: Array,
    labels: Array,
    *,
    num_members: int,
    num_steps: int,
    batch_size: int,
    lr: float,
    weight_decay: float = 0.0,
    mode: str = "auto",
    run: RunOptions = DEFAULT_RUN,
) -> tuple[PyTree, dict]:
  """M independently initialised classifiers, params stacked on a leading member axis.

  Member m uses ``jax.random.split(key, M)[m]`` for its init and batch order, in both modes;
  under JAX's partitionable threefry (the default) that key does not depend on M, so ENS(3)'s
  members are ENS(15)'s first three, and sequential members come through ``cached_classifier``.
  ``run``: mesh and checkpoints (sequential mode: one sub-folder per member).

  Returns:
    (stacked params (leaves (M, ...)), {"loss": (M,) final losses, "mode": resolved mode}).
  """
  if num_members < 1:
    raise ValueError(f"num_members must be positive, got {num_members}")
  mode = resolve_ensemble_mode(mode)
  keys = jax.random.split(key, num_members)
  if mode == "sequential":
    outs = [
        cached_classifier(
            k,
            spec,
            images,
            labels,
            num_steps=num_steps,
            batch_size=batch_size,
            lr=lr,
            weight_decay=weight_decay,
            run=run.sub(f"member_{m:03d}"),
        )
        for m, k in enumerate(keys)
    ]
    params = jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *[o[0] for o in outs])
    return params, {"loss": [o[1]["loss"] for o in outs], "mode": mode}
  _, _, vinit, vstep = _classifier_fns(
      spec, float(lr), float(weight_decay), int(num_steps), int(batch_size), run.mesh
  )
  images, labels = jnp.asarray(images), jnp.asarray(labels, jnp.int32)
  split = jax.vmap(jax.random.split)(keys)  # (M, 2, key)
  params, opt_state = vinit(split[:, 0], images[:1])
  step_keys = jax.vmap(lambda k: jax.random.split(k, num_steps))(split[:, 1])  # (M, T, key)
  ckpt = run.periodic(
      lambda: dict(
          kind="ensemble",
          spec=spec_to_config(spec),
          key=checkpoint.key_id(key),
          data=checkpoint.fingerprint(images, labels),
          num_members=num_members,
          num_steps=num_steps,
          batch_size=batch_size,
          lr=lr,
          weight_decay=weight_decay,
      )
  )
  carry = place(run, (params, opt_state, images, labels))
  (params, _, _, _), losses = fit_loop(vstep, carry, jnp.swapaxes(step_keys, 0, 1), ckpt)
  tail = np.mean(np.stack(losses[-max(1, num_steps // 10) :]), axis=0)
  return params, {"loss": [float(v) for v in tail], "mode": mode}


def ensemble_logits(
    spec: models.CNNSpec, stacked_params: PyTree, x: Array, mode: str = "auto"
) -> Array:
  """Logits of every member: (M, B, out_dim). ``vmap`` or a ``lax.map`` over members (CPU)."""
  net = models.module(spec)
  apply = lambda p: net.apply(p, x)
  if resolve_ensemble_mode(mode) == "vmap":
    return jax.vmap(apply)(stacked_params)
  return jax.lax.map(apply, stacked_params)


# ----------------------------------------------------------------------------------------------
# A cache for classifiers that several methods share within one process.
# ----------------------------------------------------------------------------------------------

# Entries kept: per (task, seed) the plain classifier and ENS(15)'s members, ~1 MB each.
_CACHE_SIZE = 48
# (key, spec, data, budget) -> (params, info, seconds its training took), oldest first.
_CLASSIFIER_CACHE: collections.OrderedDict = collections.OrderedDict()
# Training seconds of every classifier served from the cache so far (``reused_seconds``).
_REUSED = {"seconds": 0.0}


def clear_classifier_cache() -> None:
  """Forgets the classifiers ``cached_classifier`` holds (a benchmark that times whole fits
  makes every fit train its own)."""
  _CLASSIFIER_CACHE.clear()


def reused_seconds() -> float:
  """The training seconds of every classifier ``cached_classifier`` has served from its cache in
  this process: a fit timed by wall clock adds the growth of this total across the fit, so its
  seconds are those of the fit alone, whichever method trained a shared network first."""
  return _REUSED["seconds"]


def cached_classifier(
    key: Array, spec: models.CNNSpec, images, labels, *, run: RunOptions = DEFAULT_RUN, **train_kw
) -> tuple[PyTree, dict]:
  """``train_classifier`` memoised on (key, spec, data, budget) within this process.

  CSD, CSD-Aug, CSD-OOD, RND, SGLD and Laplace each need the same plain classifier of a seed
  (for accuracy, as a start or as Laplace's MAP), and ENS(3)'s members are ENS(15)'s first
  three (``train_ensemble``); training each once is an optimisation with the same result.
  ``run`` (mesh, checkpoints) is not part of the cache key: it does not change the result.
  A hit adds the network's training seconds to ``reused_seconds``.
  """
  cache_key = (
      checkpoint.key_id(key),
      spec,
      checkpoint.fingerprint(images, labels),
      tuple(sorted(train_kw.items())),
  )
  if cache_key in _CLASSIFIER_CACHE:
    _CLASSIFIER_CACHE.move_to_end(cache_key)
    params, info, seconds = _CLASSIFIER_CACHE[cache_key]
    _REUSED["seconds"] += seconds
    return params, info
  t0 = time.perf_counter()
  params, info = train_classifier(key, spec, images, labels, run=run, **train_kw)
  jax.block_until_ready(params)
  _CLASSIFIER_CACHE[cache_key] = (params, info, time.perf_counter() - t0)
  while len(_CLASSIFIER_CACHE) > _CACHE_SIZE:
    _CLASSIFIER_CACHE.popitem(last=False)
  return params, info


# ----------------------------------------------------------------------------------------------
# JSON output and the shared training loop (checkpoints: ``csd_jax.checkpoint``).
# ----------------------------------------------------------------------------------------------


def write_json(path: str, obj: Any) -> None:
  """Writes JSON atomically (tmp file + rename), so a kill never leaves a half file."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  tmp = f"{path}.tmp{os.getpid()}"
  with open(tmp, "w") as f:
    json.dump(obj, f, indent=1, sort_keys=True)
  os.replace(tmp, path)


def fit_loop(step: Callable, carry: Any, keys: Array, checkpoint=None) -> tuple[Any, list]:
  """Calls the jitted ``step(carry, keys[t]) -> (carry, loss)`` for t = 0 .. T-1.

  A Python loop (see the module docstring). ``checkpoint``: a ``csd_jax.checkpoint.Periodic``
  (or None): the loop resumes after its newest checkpoint and saves every ``every`` steps and
  at the end, with the losses so far. As step t always gets ``keys[t]``, a resumed loop ends
  bitwise equal to an uninterrupted one (on CPU).

  Returns:
    (final carry, the T losses as numpy arrays).
  """
  num_steps = keys.shape[0]
  losses: list = []
  start = 0
  if checkpoint is not None:
    carry, start, meta = checkpoint.restore(carry)
    losses = [np.asarray(v, np.float32) for v in meta.get("losses", [])][:start]
  for t in range(start, num_steps):
    carry, loss = step(carry, keys[t])
    losses.append(loss)
    if checkpoint is not None and checkpoint.due(t + 1, num_steps):
      checkpoint.maybe_save(
          t + 1, carry, num_steps, meta={"losses": [np.asarray(v).tolist() for v in losses]}
      )
  return carry, [np.asarray(v) for v in losses]
