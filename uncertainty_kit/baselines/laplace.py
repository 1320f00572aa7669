"""Last-layer Laplace approximation (Daxberger et al. 2021) with the full GGN, via laplax.

The MAP is a plain classifier of the shared backbone and budget. Its head (``kernel`` n×10 and
``bias`` 10, P = 10(n+1) parameters) gets a Gaussian posterior N(θ*, (G + δI)⁻¹), G the GGN of
the summed cross-entropy over the training set, computed densely by ``laplax`` (``laplax.laplace``
with ``curv_type="full"``), and the posterior scale by laplax's ``posterior_fn``. The prior
precision δ maximises the Laplace marginal likelihood over a log grid
(``_log_marginal_likelihood``). The head is linear in its parameters, so the linearised
predictive is exact:
logits f(x) ~ N(f*(x), J(x) Σ J(x)ᵀ); ``num_samples`` draws of it (a key fixed at fit) are
scored by ``scores.sample_uncertainty``, by default the mutual
information (the best of those tried on the embedded benchmark: docs/results.md).

laplax (PyPI ``laplax`` 0.0.2, MIT, JAX-native; pure-JAX dependencies jaxtyping and loguru) is
imported lazily: it is needed by this baseline only.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.flatten_util import ravel_pytree

from csd_jax import models
from uncertainty_kit import keys
from uncertainty_kit import scores
from uncertainty_kit import train
from uncertainty_kit.interface import MethodState


def _head(params):
  return params["params"]["head"]


def _head_apply(head, phi):
  """The classifier head in the standard parameterisation: ϕ W + b."""
  return phi @ head["kernel"] + head["bias"]


def _features(config, params, x):
  net = models.module(train.classifier_spec(config))
  return net.apply(params, x, method=models.SpecNet.features)


def _log_marginal_likelihood(ggn, head, batch, prior_prec):
  """Laplace evidence: log p(D|θ*) + log p(θ*) − ½ log det((G + δI) / 2π), for N(0, δ⁻¹I).

  Written here because laplax 0.0.2's ``marginal_log_likelihood`` treats ``"cross_entropy"`` as a
  sigmoid (binary) loss and scales it by 1/(2σ), which is wrong for softmax classification.
  """
  flat, _ = ravel_pytree(head)
  logits = _head_apply(head, batch["input"])
  log_lik = -jnp.sum(optax.softmax_cross_entropy_with_integer_labels(logits, batch["target"]))
  p = flat.size
  log_prior = -0.5 * prior_prec * jnp.sum(flat**2) + 0.5 * p * jnp.log(prior_prec)
  log_det = jnp.linalg.slogdet(ggn + prior_prec * jnp.eye(p))[1]
  return log_lik + log_prior - 0.5 * log_det


def fit(key, data, config, context=None, run: train.RunOptions = train.DEFAULT_RUN) -> MethodState:
  del context
  import laplax  # lazily, with its logger: only this baseline needs them
  from loguru import logger

  logger.disable("laplax")
  spec = train.classifier_spec(config)
  if spec.parameterization != "standard":
    raise ValueError("the Laplace head assumes the standard parameterisation")
  k_cls, k_samples = keys.classifier_key(key), jax.random.fold_in(key, 1)
  params, _ = train.cached_classifier(
      k_cls, spec, data.images, data.labels, run=run.sub("classifier"), **train.train_kwargs(config)
  )
  phi = jnp.concatenate(
      [
          _features(config, params, data.images[i : i + 1024])
          for i in range(0, len(data.images), 1024)
      ]
  )
  head = _head(params)
  batch = {"input": phi, "target": jnp.asarray(data.labels, jnp.int32)}
  model_fn = lambda input, params: _head_apply(params, input)
  posterior_fn, curv = laplax.laplace(
      model_fn, head, batch, loss_fn="cross_entropy", curv_type="full", vmap_over_data=True
  )
  mlls = {
      float(p): float(_log_marginal_likelihood(curv, head, batch, float(p)))
      for p in config["prior_prec_grid"]
  }
  finite = {p: v for p, v in mlls.items() if np.isfinite(v)}
  prior_prec = max(finite, key=finite.get) if finite else float(config["prior_prec_grid"][-1])
  scale = posterior_fn({"prior_prec": prior_prec}).state["scale"]
  cov = scale @ scale.T
  return MethodState(
      arrays={
          "params": params,
          "cov": cov,
          "sample_key": keys.key_array(k_samples),
          "prior_prec": jnp.asarray(prior_prec),
      },
      config=config,
  )


def sample_logits(state: MethodState, x) -> jax.Array:
  """(S, B, 10) samples of the linearised Gaussian predictive over the logits."""
  params = state.arrays["params"]
  phi = _features(state.config, params, x)
  head = _head(params)
  flat, unravel = ravel_pytree(head)  # the same leaf order as laplax's flattener
  mean = _head_apply(head, phi)
  jac = jax.vmap(lambda p: jax.jacobian(lambda v: _head_apply(unravel(v), p[None])[0])(flat))(phi)
  cov_f = jnp.einsum("bkp,pq,blq->bkl", jac, state.arrays["cov"], jac)
  k = mean.shape[-1]
  chol = jnp.linalg.cholesky(cov_f + 1e-6 * jnp.eye(k))
  eps = jax.random.normal(state.arrays["sample_key"], (int(state.config["num_samples"]), k))
  return mean[None] + jnp.einsum("bkl,sl->sbk", chol, eps)


def score(state: MethodState, x) -> jax.Array:
  return scores.sample_uncertainty(sample_logits(state, x), state.config["score"])


def predict(state: MethodState, x) -> jax.Array:
  return jax.nn.softmax(sample_logits(state, x), axis=-1).mean(0)
