"""Uncertainty scores of S samples of a classifier's outputs (members, passes, posterior draws).

Functionals of the class probabilities p = softmax(z), and of the raw outputs z: the quantity
the NTK-GP (and so CSD) describes is the variance of the network output, so the logit kinds
compare ensembles with CSD on CSD's terms.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array

PROBABILITY_KINDS = ("variance", "mutual_information", "entropy", "max_prob")
LOGIT_KINDS = ("logit_variance", "relative_logit_variance")
SCORE_KINDS = PROBABILITY_KINDS + LOGIT_KINDS


def sample_uncertainty(logits: Array, kind: str) -> Array:
  """Uncertainty of S samples of a classifier's outputs (higher = more OOD).

  Args:
    logits: (S, B, K) outputs z of S members / passes / posterior samples; p = softmax(z).
    kind: of the probabilities: ``"variance"``: Σ_k Var_s p_k, the total predictive variance;
      ``"mutual_information"``: H(E_s p) − E_s H(p) (BALD, epistemic part); ``"entropy"``:
      H(E_s p), total; ``"max_prob"``: 1 − max_k E_s p_k. Of the outputs:
      ``"logit_variance"``: Σ_k Var_s z_k, the ensemble variance the NTK-GP formula (and CSD)
      describes; ``"relative_logit_variance"``: Σ_k Var_s z_k / Σ_k E_s z_k², its scale-free
      form (the fraction of the outputs' second moment the samples disagree on), the
      counterpart of CSD's V(x)/Θ(x,x).

  Returns:
    (B,) scores.
  """
  if kind not in SCORE_KINDS:
    raise ValueError(f"score kind must be one of {SCORE_KINDS}, got {kind!r}")
  if kind in LOGIT_KINDS:
    var = jnp.sum(logits.var(0), axis=-1)
    if kind == "logit_variance":
      return var
    return var / jnp.maximum(jnp.sum(jnp.mean(logits**2, 0), axis=-1), 1e-30)
  probs = jax.nn.softmax(logits, axis=-1)
  mean = probs.mean(0)
  ent = lambda p: -jnp.sum(p * jnp.log(jnp.clip(p, 1e-12)), axis=-1)
  if kind == "variance":
    return jnp.sum(probs.var(0), axis=-1)
  if kind == "mutual_information":
    return ent(mean) - ent(probs).mean(0)
  if kind == "entropy":
    return ent(mean)
  return 1.0 - mean.max(-1)
