"""A sampled Bayesian neural network: stochastic-gradient Langevin dynamics (Welling & Teh 2011).

The chain runs over *all* the backbone's parameters with blackjax's SGLD kernel
(``blackjax.sgld``: θ ← θ + ε ∇log p̂(θ | D) + √(2εT) ξ, the gradient estimated on a minibatch
and scaled to the N training examples). Posterior: p(θ | D) ∝ N(θ; 0, σ²I) Π_i softmax(f(x_i; θ))
at T = ``temperature`` (T < 1: a "cold" posterior, the usual practical choice for deep nets).

The chain starts at the plain classifier every other method shares (a MAP-like point: the
classifier trained with ``defaults.TRAIN``), runs ``num_burnin`` steps, then keeps one sample every
``thin`` steps until it has ``num_samples``. The samples are scored like an ensemble's members
(``scores.sample_uncertainty`` of their outputs; mutual information by default). The step size
is constant (a decaying schedule changes little over so short a chain). The defaults (step
size 2e-5, T = 1, ``thin`` 100: 1,600 steps ≈ 5 classifier budgets, a third of ENS(15)'s) were
chosen on the embedded benchmark (docs/results.md).

blackjax (PyPI ``blackjax``, Apache-2.0, pure JAX) supplies the kernel; the loop, the sample
store and the checkpoints (``train.fit_loop``: a killed chain resumes bit for bit) are ours.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import optax

from cmdline import cli
from csd_jax import checkpoint
from csd_jax import models
from uncertainty_kit import keys
from uncertainty_kit import scores
from uncertainty_kit import train
from uncertainty_kit.interface import MethodState


def num_steps(config) -> int:
  """Chain length: burn-in, then ``thin`` steps per kept sample."""
  return int(config["num_burnin"]) + int(config["thin"]) * int(config["num_samples"])


@functools.lru_cache(maxsize=8)
def _step(
    spec: models.CNNSpec,
    num_train: int,
    batch_size: int,
    step_size: float,
    temperature: float,
    prior_std: float,
    num_burnin: int,
    thin: int,
):
  """A jitted chain step ``((pos, samples, t, x, y), key) -> (carry, minibatch loss)``."""
  import blackjax  # lazily: needed by this baseline only

  net = models.module(spec)

  def log_prior(pos):
    return -0.5 * sum(jnp.sum(p**2) for p in jax.tree.leaves(pos)) / prior_std**2

  def log_lik(pos, example):
    x, y = example
    logits = net.apply(pos, x[None])[0]
    return -optax.softmax_cross_entropy_with_integer_labels(logits, y)

  grad = blackjax.sgmcmc.gradients.grad_estimator(log_prior, log_lik, num_train)
  sgld = blackjax.sgld(grad)

  def step(carry, key):
    pos, samples, t, x, y = carry
    k_batch, k_noise = jax.random.split(key)
    idx = jax.random.randint(k_batch, (batch_size,), 0, x.shape[0])
    pos = sgld.step(k_noise, pos, (x[idx], y[idx]), step_size, temperature)
    # after burn-in, every ``thin``-th step's position is sample (t + 1 − burnin) / thin − 1
    after = t + 1 - num_burnin
    keep = (after > 0) & (after % thin == 0)
    slot = jnp.clip(after // thin - 1, 0, jax.tree.leaves(samples)[0].shape[0] - 1)
    samples = jax.tree.map(lambda s, p: s.at[slot].set(jnp.where(keep, p, s[slot])), samples, pos)
    loss = jnp.mean(optax.softmax_cross_entropy_with_integer_labels(net.apply(pos, x[idx]), y[idx]))
    return (pos, samples, t + 1, x, y), loss

  return jax.jit(step)


def fit(key, data, config, context=None, run: train.RunOptions = train.DEFAULT_RUN) -> MethodState:
  """Runs the chain from the shared classifier; returns the ``num_samples`` kept positions."""
  del context
  if int(config["num_samples"]) < 2 or int(config["thin"]) < 1 or int(config["num_burnin"]) < 0:
    raise ValueError(
        "SGLD needs num_samples >= 2, thin >= 1 and num_burnin >= 0, got "
        f"{config['num_samples']}, {config['thin']}, {config['num_burnin']}"
    )
  if not (
      float(config["step_size"]) > 0
      and float(config["temperature"]) > 0
      and float(config["prior_std"]) > 0
  ):
    raise ValueError("SGLD's step_size, temperature and prior_std must be positive")
  spec = train.classifier_spec(config)
  start, _ = train.cached_classifier(
      keys.classifier_key(key),
      spec,
      data.images,
      data.labels,
      run=run.sub("classifier"),
      **train.train_kwargs(config),
  )
  x = jnp.asarray(data.images)
  y = jnp.asarray(data.labels, jnp.int32)
  step = _step(
      spec,
      int(x.shape[0]),
      int(config["batch_size"]),
      float(config["step_size"]),
      float(config["temperature"]),
      float(config["prior_std"]),
      int(config["num_burnin"]),
      int(config["thin"]),
  )
  samples = jax.tree.map(
      lambda p: jnp.zeros((int(config["num_samples"]),) + p.shape, p.dtype), start
  )
  ckpt = run.sub("sgld").periodic(
      lambda: dict(
          kind="sgld",
          config=cli.to_dict(config),
          key=checkpoint.key_id(key),
          data=checkpoint.fingerprint(data.images, data.labels),
      )
  )
  carry = train.place(run, (start, samples, jnp.zeros((), jnp.int32), x, y))
  (_, samples, _, _, _), losses = train.fit_loop(
      step, carry, jax.random.split(jax.random.fold_in(key, 7), num_steps(config)), ckpt
  )
  if not all(jnp.isfinite(l) for l in losses[-5:]):
    raise FloatingPointError(
        f"the SGLD chain diverged (step_size {config['step_size']}): " "lower it"
    )
  return MethodState(arrays={"samples": samples}, config=config)


def sample_logits(state: MethodState, x) -> jax.Array:
  """(S, B, 10) outputs of every kept sample."""
  return train.ensemble_logits(train.classifier_spec(state.config), state.arrays["samples"], x)


def score(state: MethodState, x) -> jax.Array:
  return scores.sample_uncertainty(sample_logits(state, x), state.config["score"])


def predict(state: MethodState, x) -> jax.Array:
  return jax.nn.softmax(sample_logits(state, x), axis=-1).mean(0)
