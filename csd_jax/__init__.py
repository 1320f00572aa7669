"""csd-jax: Contextual Similarity Distillation in JAX.

The variance of an infinitely large, randomly initialised deep ensemble from one network:
``g(x, c) = φ(x)ᵀψ(c)`` is regressed on kernel labels ``k(x_i, c_j)`` and
``V(x) ≈ k(x, x) − g(x, x)``.

Modules:
  csd            the estimator: ``CSD`` (static definition), ``init``, ``train_step``, ``variance``
  fitting        ``fit``: the scanned, checkpointed, mesh-aware training loop
  preconditioner the context preconditioner of the matched (linear) form
  single_query   the exact single-query construction (one query, full-batch gradient descent)
  ntk            exact finite-width NTKs and infinite-width kernels (neural-tangents)
  posterior      closed-form NTK-GP variances (the quantity CSD estimates)
  models         network specs shared by the flax nets and the neural-tangents kernels
  parallel       ``jax.sharding`` meshes and ``jax.distributed`` start-up
  checkpoint     orbax checkpoints that make every loop resumable
  checks         input checks raising one ``ValueError`` naming the argument
"""

from csd_jax import checkpoint
from csd_jax import checks
from csd_jax import csd
from csd_jax import fitting
from csd_jax import models
from csd_jax import ntk
from csd_jax import parallel
from csd_jax import posterior
from csd_jax import preconditioner
from csd_jax import single_query
from csd_jax.csd import CSD
from csd_jax.csd import CSDState
from csd_jax.csd import DEEP_DEFAULTS
from csd_jax.csd import deep_form
from csd_jax.csd import init
from csd_jax.csd import label_block
from csd_jax.csd import label_features
from csd_jax.csd import pair_loss
from csd_jax.csd import prior_variance
from csd_jax.csd import sample_batch
from csd_jax.csd import train_step
from csd_jax.csd import variance
from csd_jax.fitting import fit
from csd_jax.models import CNNSpec
from csd_jax.models import MLPSpec
from csd_jax.ntk import empirical_ntk
from csd_jax.ntk import infinite_kernels
from csd_jax.ntk import last_layer_ntk
from csd_jax.posterior import ntkgp_variance
from csd_jax.posterior import ntkgp_variance_fn
from csd_jax.posterior import ntkgp_variance_from_features

__version__ = "0.1.0"

__all__ = [
    "CNNSpec",
    "CSD",
    "CSDState",
    "DEEP_DEFAULTS",
    "MLPSpec",
    "checkpoint",
    "checks",
    "csd",
    "deep_form",
    "empirical_ntk",
    "fit",
    "fitting",
    "infinite_kernels",
    "init",
    "label_block",
    "label_features",
    "last_layer_ntk",
    "models",
    "ntk",
    "ntkgp_variance",
    "ntkgp_variance_fn",
    "ntkgp_variance_from_features",
    "pair_loss",
    "parallel",
    "posterior",
    "preconditioner",
    "prior_variance",
    "sample_batch",
    "single_query",
    "train_step",
    "variance",
]
