"""Deep ensembles (Lakshminarayanan et al. 2017): M independently initialised classifiers.

Members are trained with ``uncertainty_kit.train.train_ensemble`` (vmapped over stacked
parameters on accelerators, one after another on CPU, see that module). Uncertainty: a function
of the members' outputs (config ``score``, see ``scores.sample_uncertainty``), by default the
mutual information H(E_m p) − E_m H(p), the best of the probability scores on the embedded
benchmark (docs/results.md). ``benchmarks.ood`` also scores the members by the variance of their
output (``"relative_logit_variance"``), the quantity CSD estimates.
"""

from __future__ import annotations

import jax

from uncertainty_kit import scores
from uncertainty_kit import train
from uncertainty_kit.interface import MethodState


def fit(key, data, config, context=None, run: train.RunOptions = train.DEFAULT_RUN) -> MethodState:
  """Trains ``config["num_members"]`` classifiers on ``data`` (a ``Dataset``)."""
  del context
  params, info = train.train_ensemble(
      key,
      train.classifier_spec(config),
      data.images,
      data.labels,
      num_members=int(config["num_members"]),
      mode=config["mode"],
      run=run,
      **train.train_kwargs(config),
  )
  return MethodState(arrays={"params": params}, config=config)


def member_logits(state: MethodState, x) -> jax.Array:
  """(M, B, 10) outputs of every member."""
  return train.ensemble_logits(
      train.classifier_spec(state.config), state.arrays["params"], x, state.config["mode"]
  )


def score(state: MethodState, x) -> jax.Array:
  return scores.sample_uncertainty(member_logits(state, x), state.config["score"])


def predict(state: MethodState, x) -> jax.Array:
  return jax.nn.softmax(member_logits(state, x), axis=-1).mean(0)
