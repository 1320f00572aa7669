"""The CSD training loop: ``fit`` runs ``csd.train_step`` under ``lax.scan`` on device,
checkpointed and resumable, data-parallel over a ``jax.sharding.Mesh`` when given one.

Context choices (the three CSD variants) are arguments of ``fit``: none (CSD), ``augment``
(CSD-Aug) or ``context`` (CSD-OOD).
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp

from csd_jax import checkpoint
from csd_jax import csd
from csd_jax import models
from csd_jax import parallel
from csd_jax import preconditioner
from csd_jax.checks import check_array
from csd_jax.csd import CSD, AugmentFn, CSDState

Array = jax.Array


def step_key(key: Array, step: Array) -> Array:
  """The PRNG key of ``fit``'s step ``step``: a function of the step index only, so the result
  does not depend on how the loop is chunked (logging, checkpoints, resumption)."""
  return jax.random.fold_in(key, step)


LOOPS = ("auto", "scan", "python")


def resolve_loop(model: CSD, loop: str = "auto") -> str:
  """``"auto"``: ``"python"`` (one jitted call per step) on XLA:CPU when a tower is a conv net
  or a user's module, else ``"scan"`` (all steps of a chunk in one ``lax.scan``). On XLA:CPU a
  convolution's backward pass inside a loop body runs ~40× slower than the same step called
  from Python (jax-ml/jax#12868)."""
  if loop not in LOOPS:
    raise ValueError(f"loop must be one of {LOOPS}, got {loop!r}")
  if loop != "auto":
    return loop
  towers = [n for n in (model.feature_net, model.context_net) if n is not None]
  conv = any(not models.is_spec(n) or isinstance(n, models.CNNSpec) for n in towers)
  return "python" if conv and jax.default_backend() == "cpu" else "scan"


def _step(
    model: CSD,
    state: CSDState,
    key: Array,
    step: Array,
    x_train: Array,
    extra: Array | None,
    augment: AugmentFn | None,
    batch_size: int,
    context_batch_size: int,
    extra_fraction: float,
    mesh: Any,
    on_features: bool,
) -> tuple[CSDState, Array]:
  """Step ``step``: a batch sampled on device with ``step_key(key, step)``, one update.
  ``on_features``: ``x_train`` / ``extra`` are ϕ̂ rows (matched towers, ``fit``)."""
  x, c = csd.sample_batch(
      model,
      step_key(key, step),
      x_train,
      extra,
      augment,
      batch_size,
      context_batch_size,
      extra_fraction,
  )
  x, c = parallel.constrain_batch(mesh, (x, c))
  if on_features:
    state, metrics = csd.apply_gradients(model, state, lambda p: csd.feature_loss(model, p, x, c))
  else:
    state, metrics = csd.train_step(model, state, x, c)
  return state, metrics["loss"]


_STATIC = (0, 6, 7, 8, 9, 10, 11, 12)


@functools.partial(jax.jit, static_argnums=_STATIC)
def train_chunk(
    model: CSD,
    state: CSDState,
    key: Array,
    start: Array,
    x_train: Array,
    extra: Array | None,
    augment: AugmentFn | None,
    batch_size: int,
    context_batch_size: int,
    extra_fraction: float,
    num_steps: int,
    mesh: Any,
    on_features: bool,
) -> tuple[CSDState, Array]:
  """Steps ``start .. start + num_steps - 1`` under one ``lax.scan`` (``fit``'s scanned chunk;
  ``on_features``: ``x_train`` / ``extra`` are ϕ̂ rows). Returns (state, (num_steps,) losses)."""

  def body(state, step):
    return _step(
        model,
        state,
        key,
        step,
        x_train,
        extra,
        augment,
        batch_size,
        context_batch_size,
        extra_fraction,
        mesh,
        on_features,
    )

  return jax.lax.scan(body, state, start + jnp.arange(num_steps, dtype=jnp.uint32))


@functools.partial(jax.jit, static_argnums=(0, 6, 7, 8, 9, 10, 11))
def _train_one(
    model: CSD,
    state: CSDState,
    key: Array,
    step: Array,
    x_train: Array,
    extra: Array | None,
    augment: AugmentFn | None,
    batch_size: int,
    context_batch_size: int,
    extra_fraction: float,
    mesh: Any,
    on_features: bool,
) -> tuple[CSDState, Array]:
  """Step ``step`` alone (``loop="python"`` calls it once per step)."""
  return _step(
      model,
      state,
      key,
      step,
      x_train,
      extra,
      augment,
      batch_size,
      context_batch_size,
      extra_fraction,
      mesh,
      on_features,
  )


def _run_steps(
    loop: str, model: CSD, state: CSDState, key: Array, start: int, n: int, *args
) -> tuple[CSDState, Array]:
  """Steps ``start .. start + n - 1`` as one scan or ``n`` jitted calls; (state, (n,) losses)."""
  if loop == "scan":
    return train_chunk(model, state, key, jnp.uint32(start), *args[:-2], n, *args[-2:])
  losses = []
  for t in range(start, start + n):
    state, loss = _train_one(model, state, key, jnp.uint32(t), *args)
    losses.append(loss)
  return state, jnp.stack(losses)


def fit_identity(
    model: CSD,
    state: CSDState,
    key: Array,
    x_train: Array,
    *,
    context: Array | None,
    augment: AugmentFn | None,
    num_steps: int,
    batch_size: int,
    context_batch_size: int,
    extra_fraction: float,
    loop: str,
) -> dict:
  """Everything that changes a fit's result, as JSON (a checkpoint's identity): the model
  field by field (the optimizer's hyper-parameters included: ``checkpoint.describe``), the
  data's and contexts' fingerprints, the augmentation, the budget, the key and the initial
  state."""
  return dict(
      kind="csd",
      model={
          f.name: checkpoint.describe(getattr(model, f.name)) for f in dataclasses.fields(model)
      },
      key=checkpoint.key_id(key),
      x_train=checkpoint.fingerprint(x_train),
      context=None if context is None else checkpoint.fingerprint(context),
      augment=None if augment is None else checkpoint.describe(augment),
      num_steps=num_steps,
      batch_size=batch_size,
      context_batch_size=context_batch_size,
      extra_fraction=extra_fraction,
      loop=loop,
      init=checkpoint.fingerprint(
          *jax.tree_util.tree_leaves(
              (state.params, state.prior_params, state.input_mean, state.input_std)
          )
      ),
  )


def _context_rows(
    model: CSD,
    state: CSDState,
    x_train: Array,
    context: Array | None,
    augment: AugmentFn | None,
    key: Array | None,
) -> tuple[Array, Array | None]:
  """ϕ̂ of X and of the extra context rows (``context``, or one augmentation of every row of X)."""
  if context is None and augment is not None:
    if key is None:
      raise ValueError("context_second_moment with augment needs a key")
    context = jax.jit(augment)(key, x_train)
  phi_c = None if context is None else csd.label_features(model, state, context)
  return csd.label_features(model, state, x_train), phi_c


def context_second_moment(
    model: CSD,
    state: CSDState,
    x_train: Array,
    *,
    context: Array | None = None,
    augment: AugmentFn | None = None,
    extra_fraction: float = 0.5,
    key: Array | None = None,
) -> Array:
  """Σ_C = E_c[ϕ̂(c)ϕ̂(c)ᵀ] (d, d) over the distribution ``fit`` draws contexts from: X with
  probability 1 − extra_fraction, else a ``context`` row or (with ``augment``) one
  augmentation of every row of X, drawn with ``key``."""
  phi_x, phi_c = _context_rows(model, state, x_train, context, augment, key)
  return preconditioner.mixture_moment(phi_x, phi_c, extra_fraction)


def _checked_fit_args(
    model: CSD,
    x_train: Array,
    context: Array | None,
    *,
    num_steps: int,
    batch_size: int,
    context_batch_size: int | None,
    extra_fraction: float,
    log_every: int,
    loop: str,
) -> tuple[int, str]:
  """``fit``'s argument checks, in its order; returns (Bc with None = Bx, the resolved loop)."""
  check_array("x_train", x_train, min_rank=2)
  if context is not None:
    check_array("context", context, min_rank=2)
    if context.shape[1:] != x_train.shape[1:]:
      raise ValueError(
          f"context must have per-example shape {x_train.shape[1:]}, " f"got {context.shape[1:]}"
      )
  if context_batch_size is None:
    context_batch_size = batch_size
  for name, v in (
      ("num_steps", num_steps),
      ("batch_size", batch_size),
      ("context_batch_size", context_batch_size),
      ("log_every", log_every),
  ):
    if isinstance(v, bool) or int(v) != v or v < 1:
      raise ValueError(f"{name} must be a positive integer, got {v!r}")
  loop = resolve_loop(model, loop)
  if not 0.0 <= extra_fraction <= 1.0:
    raise ValueError(f"extra_fraction must be in [0, 1], got {extra_fraction}")
  return context_batch_size, loop


def _placed_inputs(
    model: CSD,
    state: CSDState,
    x_train: Array,
    context: Array | None,
    augment: AugmentFn | None,
    mesh: Any,
) -> tuple[CSDState, Array, Array | None, bool]:
  """(state, X, C, on_features) as the steps read them: matched towers without ``augment`` see
  inputs only through the frozen ϕ̂, so X and C become ϕ̂ of them (N, d), computed once; with a
  ``mesh`` all three are replicated over it."""
  on_features = model.matched and augment is None
  if on_features:
    x_train = csd.label_features(model, state, x_train)
    context = None if context is None else csd.label_features(model, state, context)
  if mesh is not None:
    state = parallel.replicate(mesh, state)
    x_train = parallel.replicate(mesh, x_train)
    context = None if context is None else parallel.replicate(mesh, context)
  return state, x_train, context, on_features


def _preconditioned(
    model: CSD,
    state: CSDState,
    key: Array,
    x_train: Array,
    context: Array | None,
    augment: AugmentFn | None,
    *,
    extra_fraction: float,
    context_batch_size: int,
    on_features: bool,
    mesh: Any,
    verbose: bool,
) -> tuple[CSDState, float]:
  """The state with the context preconditioner set from Σ_C before step 0, and the ε used
  (``preconditioner.stable_jitter``: at least ``model.precondition_jitter``)."""
  rows = (
      (x_train, context)
      if on_features
      else _context_rows(model, state, x_train, context, augment, jax.random.split(key)[0])
  )
  moment = preconditioner.mixture_moment(*rows, extra_fraction)
  jitter = preconditioner.stable_jitter(moment, rows, context_batch_size, model.precondition_jitter)
  if jitter > model.precondition_jitter and verbose:
    print(
        f"csd fit: precondition_jitter raised {model.precondition_jitter:g} -> {jitter:g} "
        "(a context of high leverage: see preconditioner.stable_jitter)",
        file=sys.stderr,
        flush=True,
    )
  state = preconditioner.precondition(model, state, moment, jitter)
  if mesh is not None:
    state = parallel.replicate(mesh, state)
  return state, jitter


def _check_finite(model: CSD, losses: Array, done: int, n: int) -> None:
  """Raises ``FloatingPointError`` when a loss of steps ``done .. done + n - 1`` is not finite."""
  if not bool(jnp.all(jnp.isfinite(losses))):
    raise FloatingPointError(
        f"csd fit diverged (non-finite loss) between steps {done} and {done + n}: lower the "
        "learning rate"
        + (
            " or raise precondition_jitter (the preconditioner amplifies "
            "minibatch noise along weak feature directions)"
            if model.precondition_jitter > 0
            else ""
        )
    )


def _log_progress(done: int, num_steps: int, loss: float, steps_per_s: float) -> None:
  print(
      f"csd fit: step {done}/{num_steps}  loss {loss:.3e}  {steps_per_s:.0f} steps/s",
      file=sys.stderr,
      flush=True,
  )


def fit(
    model: CSD,
    state: CSDState,
    key: Array,
    x_train: Array,
    *,
    num_steps: int,
    batch_size: int = 256,
    context_batch_size: int | None = None,
    context: Array | None = None,
    augment: AugmentFn | None = None,
    extra_fraction: float = 0.5,
    mesh: Any = None,
    log_every: int = 500,
    checkpoint_dir: str | None = None,
    checkpoint_every: int = 0,
    verbose: bool = True,
    loop: str = "auto",
) -> tuple[CSDState, dict]:
  """Trains g for ``num_steps`` steps on random (x, c) batches.

  Context choices (the three CSD variants):
    * CSD: neither ``context`` nor ``augment``: C = X.
    * CSD-Aug: ``augment(key, batch) -> batch``: each context drawn from X is replaced
      by its augmentation with probability ``extra_fraction``.
    * CSD-OOD: ``context`` (M, ...) unlabeled inputs: each context is drawn from it with
      probability ``extra_fraction``, else from X (keeping X ⊂ C, see module docstring).

  Args:
    model, state: as from ``init``.
    key: PRNG key for batch sampling (step t uses ``step_key(key, t)``).
    x_train: (N, ...) training inputs, raw (the model's ``input_norm`` is applied inside, after
      sampling and augmentation).
    num_steps: total optimiser steps (> 0).
    batch_size / context_batch_size: Bx and Bc (Bc: None = Bx).
    mesh: a ``jax.sharding.Mesh`` with a ``"data"`` axis to run data-parallel.
    log_every: steps between progress lines (stderr) and history entries.
    (Matched towers without ``augment`` run on ϕ̂ of X and C computed once; with
    ``model.precondition_jitter`` > 0 the preconditioner is set here, before step 0.)
    checkpoint_dir: resume from / checkpoint to this folder (``csd_jax.checkpoint``); a run
      killed at any point and rerun with the same arguments ends bitwise equal (CPU) to an
      uninterrupted one. A checkpoint of other settings (``fit_identity``) is never resumed:
      ``checkpoint.IdentityMismatchError`` names what differs. checkpoint_every: steps
      between checkpoints (0: only at the end).
    loop: ``"scan"``, ``"python"`` or ``"auto"`` (``resolve_loop``): how steps are run; the
      same batches and updates either way.

  Returns:
    (trained state, {"step": [...], "loss": [...], "steps_per_s": float,
    "precondition_jitter": the ε used (``stable_jitter``) or None}).
  """
  context_batch_size, loop = _checked_fit_args(
      model,
      x_train,
      context,
      num_steps=num_steps,
      batch_size=batch_size,
      context_batch_size=context_batch_size,
      extra_fraction=extra_fraction,
      log_every=log_every,
      loop=loop,
  )
  identity = (
      None
      if checkpoint_dir is None
      else fit_identity(
          model,
          state,
          key,
          x_train,
          context=context,
          augment=augment,
          num_steps=num_steps,
          batch_size=batch_size,
          context_batch_size=context_batch_size,
          extra_fraction=extra_fraction,
          loop=loop,
      )
  )
  ckpt = checkpoint.Periodic(checkpoint_dir, checkpoint_every, identity)
  state, x_train, context, on_features = _placed_inputs(
      model, state, x_train, context, augment, mesh
  )
  state, done, saved = ckpt.restore(state)
  jitter = None
  if model.precondition_jitter > 0 and done == 0:
    state, jitter = _preconditioned(
        model,
        state,
        key,
        x_train,
        context,
        augment,
        extra_fraction=extra_fraction,
        context_batch_size=context_batch_size,
        on_features=on_features,
        mesh=mesh,
        verbose=verbose,
    )
  history = {"step": list(saved.get("step", [])), "loss": list(saved.get("loss", []))}
  if done and verbose:
    print(f"csd fit: resumed from {checkpoint_dir} at step {done}", file=sys.stderr, flush=True)
  first, start = done, time.perf_counter()
  boundaries = (log_every, checkpoint_every or num_steps)
  while done < num_steps:
    n = min(min(b - done % b for b in boundaries), num_steps - done)
    state, losses = _run_steps(
        loop,
        model,
        state,
        key,
        done,
        n,
        x_train,
        context,
        augment,
        batch_size,
        context_batch_size,
        extra_fraction,
        mesh,
        on_features,
    )
    _check_finite(model, losses, done, n)
    done += n
    if done % log_every == 0 or done == num_steps:
      history["step"].append(done)
      history["loss"].append(float(jnp.mean(losses)))
      if verbose:
        _log_progress(
            done, num_steps, history["loss"][-1], (done - first) / (time.perf_counter() - start)
        )
    ckpt.maybe_save(done, state, num_steps, meta=history)
  ckpt.close()
  history["steps_per_s"] = (done - first) / max(time.perf_counter() - start, 1e-9)
  history["precondition_jitter"] = jitter  # the ε used (None: no preconditioner, or resumed)
  return state, history
