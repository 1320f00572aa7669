"""The OOD kit's defaults as plain data (dicts, lists, numbers, strings, None): every method's
default config, and the benchmark's data-set names.

The config files (``configs/ood.py``) and the methods (``uncertainty_kit.methods``, the
baselines) both build on it. It imports nothing, so a config file that reads it loads neither
JAX nor the methods' libraries (laplax, blackjax). Each function returns a fresh copy.
"""

from __future__ import annotations

NUM_CLASSES = 10

# The four MNIST-like tfds sets (``uncertainty_kit.data.load_family``).
FAMILY = ("mnist", "fashion_mnist", "kmnist", "notmnist")

# The one backbone family for every method: a small MNIST CNN (two strided 5×5 convolutions,
# one hidden dense layer), standard parameterisation (plain AdamW training), ~0.2 M params.
BACKBONE = {
    "convs": ((16, 5, 2), (32, 5, 2)),
    "widths": (128,),
    "padding": "SAME",
    "activation": "relu",
    "parameterization": "standard",
    "w_std": 2.0**0.5,
    "b_std": 0.1,
}

# The per-network training budget every method gets: num_steps × batch_size examples
# (300 × 128 ≈ 10 epochs of the 4,000 embedded training digits).
TRAIN = {"num_steps": 300, "batch_size": 128, "lr": 3e-3, "weight_decay": 1e-4}

# ``csd_jax.DEEP_DEFAULTS``, the deep form's defaults, written out so that this module imports
# no JAX (tests/test_methods.py checks that the two agree).
CSD_DEEP = {
    "embed_dim": 256,
    "lr": 1e-3,
    "adam_eps": 1e-5,
    "anneal": True,
    "num_steps": 1200,
    "batch_size": 128,
}

# The paper's context augmentations (``augment.paper_augment``'s default ``include``), and the
# ones among them that also generate evaluated OOD sets (rot90 / rot_random; the brightness and
# contrast of the perturbed-ID set).
PAPER_AUGMENTATIONS = ("flip", "rotation", "crop", "blur", "brightness_contrast")
OVERLAPPING_AUGMENTATIONS = ("rotation", "brightness_contrast")

CSD_CONTEXTS = ("train", "augment", "ood")
TOWER_FORMS = ("deep", "matched")
# The paper's deep form; the benchmark also runs the other (ood.json "tower_comparison").
DEFAULT_TOWERS = "deep"
# The CSD methods by name and the context each one fits on.
CSD_NAMES = {"csd": "train", "csd_aug": "augment", "csd_ood": "ood"}

# The headline table's rows, in order: every method's own row (the main job).
MAIN_METHODS = (
    "csd",
    "csd_aug",
    "csd_ood",
    "ens3",
    "ens15",
    "mc_dropout",
    "laplace",
    "bnn_mcmc",
    "rnd",
    "ntkgp_exact",
)


def common() -> dict:
  """The shared part of every method's default config."""
  return {"backbone": dict(BACKBONE), "train": dict(TRAIN)}


def csd(context: str = "train", towers: str = DEFAULT_TOWERS) -> dict:
  """CSD's defaults. ``num_steps``/``batch_size`` are g's own budget (Bx × Bc label blocks).

  ``towers="deep"``: the paper's estimator (``csd.CSD.deep``): a fixed random prior net
  ``prior_net`` (the backbone's convolutions, then ``prior_net.widths``) gives the cosine
  labels; φ and ψ are ``tower`` CNNs on raw inputs (separate, or one torso with two heads),
  unit-normalised, trained by Adam with a linear anneal on the diagonal-weighted pair loss.
  ``towers="matched"``: the exact last-layer NTK-GP of the trained classifier, solved by
  preconditioned gradient descent (the validation reference).
  """
  if context not in CSD_CONTEXTS:
    raise ValueError(f"context must be one of {CSD_CONTEXTS}, got {context!r}")
  if towers not in TOWER_FORMS:
    raise ValueError(f"towers must be one of {TOWER_FORMS}, got {towers!r}")
  config = {
      **common(),
      "context": context,
      "towers": towers,
      "score": "relative_variance",  # or "variance" (uncertainty_kit.methods)
      "augment": "paper",
      "augment_strength": 1.0,
  }
  if towers == "deep":
    return {
        **config,
        "prior": "init",
        # Both over the backbone's other settings (activation, init scales).
        "prior_net": {
            "convs": list(BACKBONE["convs"]),
            "widths": [256],
            "b_std": BACKBONE["b_std"],
        },
        "tower": {
            "convs": list(BACKBONE["convs"]),
            "widths": [256, 256],
            "b_std": BACKBONE["b_std"],
            # Distance-preserving towers (SNGP, DDU): c sets each hidden layer's spectral norm,
            # residual adds a layer's input where shapes agree (``models.CNNSpec``).
            "spectral_norm": None,
            "residual": False,
        },
        "embed_dim": CSD_DEEP["embed_dim"],
        # x̃ = clip((x − μ)/σ, ±input_clip) with training-set statistics before every net (the
        # prior's labels included): "pixel", "global" or "none" (``csd.CSD.input_norm``).
        "normalize_inputs": "none",
        "input_clip": 5.0,
        "shared_torso": False,
        "normalize": True,
        "loss_weighting": "diagonal",
        "lr": CSD_DEEP["lr"],
        "adam_eps": CSD_DEEP["adam_eps"],
        "anneal": CSD_DEEP["anneal"],
        # ``csd.deep_form``'s defaults, tuned on the tuning split (docs/results.md).
        "num_steps": CSD_DEEP["num_steps"],
        "batch_size": CSD_DEEP["batch_size"],
        "context_batch_size": CSD_DEEP["batch_size"],
        # CSD-Aug: each context replaced by its augmentation with p = 0.25 (the paper's p);
        # CSD-OOD: by an unlabeled context row with p = 0.5.
        "extra_fraction": 0.5 if context == "ood" else 0.25,
        # paper_augment's transforms; the full list generates rotated / jittered images, which
        # are evaluated OOD sets (``csd_aug_no_overlap`` leaves those out).
        "augment_include": list(PAPER_AUGMENTATIONS),
    }
  return {
      **config,
      "augment": "random",
      # The trained classifier's features: on this benchmark the random-init kernel ranks the
      # resized sklearn digits as less novel than held-out MNIST (``benchmarks.kernel_ceiling``).
      "prior": "trained",
      # ε of ``preconditioner.context_preconditioner`` relative to tr Σ_C (None = auto: 1e-5 for
      # the trained prior, 1e-3 for the random-init one, whose features are ill-conditioned); a
      # floor that ``preconditioner.stable_jitter`` raises until no context row has leverage
      # > 2 Bc.
      "precondition_jitter": None,
      "matched_lr": 0.5,
      "matched_momentum": 0.9,
      "matched_clip": 0.0,
      # Early stopping is the ridge of the NTK-GP the fit converges to (docs/results.md).
      "num_steps": 3000,
      "batch_size": 128,
      "context_batch_size": 1024,  # cheap on cached features; tames high-leverage contexts
      "extra_fraction": 0.5,
      "augment_pool": 2,  # CSD-Aug: augmented copies per training image (0 = on the fly)
  }


def exact() -> dict:
  """``ntkgp_exact``. ``ridge``: λ relative to tr Σ_X (Σ_X = ΦᵀΦ/N), i.e. ``diag_reg`` = ridge · N
  in ``posterior``'s units. 1e-6 is about the ridge CSD's 3000-step matched fit converges to
  (docs/results.md)."""
  return {**common(), "prior": "trained", "ridge": 1e-6, "score": "relative_variance"}


def ensemble(num_members: int) -> dict:
  """A deep ensemble of ``num_members`` classifiers, scored by the members' mutual information."""
  return {**common(), "num_members": num_members, "score": "mutual_information", "mode": "auto"}


def mc_dropout() -> dict:
  return {**common(), "dropout_rate": 0.25, "num_passes": 16, "score": "entropy"}


def laplace() -> dict:
  return {
      **common(),
      "num_samples": 64,
      "score": "mutual_information",
      "prior_prec_grid": [1e-2, 1e-1, 1.0, 1e1, 1e2, 1e3],
  }


def sgld() -> dict:
  """``bnn_mcmc``: 15 samples kept every 100 steps after 100 steps of burn-in."""
  return {
      **common(),
      "num_samples": 15,
      "num_burnin": 100,
      "thin": 100,
      "batch_size": 128,
      "step_size": 2e-5,
      "temperature": 1.0,
      "prior_std": 1.0,
      "score": "mutual_information",
  }


def rnd() -> dict:
  return {
      **common(),
      # Dense layers after the backbone's conv torso; each net ends in a linear out_dim head.
      "predictor_widths": [256, 256],
      "target_widths": [256],
      "out_dim": 256,
      "lr": 3e-3,
      "anneal": "linear",  # lr schedule to 0 over num_steps: linear, cosine or constant
      "weight_decay": 0.0,  # > 0: AdamW (decoupled), else Adam
      "normalize_inputs": "pixel",  # pixel, global or none (uncertainty_kit.baselines.rnd)
      "clip": 5.0,  # |x̃| bound after normalisation; None: no clipping
      "num_steps": None,  # predictor's steps; None: the shared train.num_steps
      "batch_size": None,  # None: the shared train.batch_size
  }


def methods() -> dict[str, dict]:
  """Every method's default config by name, in the registry's order."""
  out = {name: csd(context) for name, context in CSD_NAMES.items()}
  out.update(
      ens3=ensemble(3),
      ens15=ensemble(15),
      mc_dropout=mc_dropout(),
      laplace=laplace(),
      bnn_mcmc=sgld(),
      rnd=rnd(),
      ntkgp_exact=exact(),
  )
  for name, context in CSD_NAMES.items():
    for towers in TOWER_FORMS:
      out[f"{name}_{towers}"] = csd(context, towers)
  out["csd_aug_no_overlap"] = {
      **csd("augment"),
      "augment_include": [a for a in PAPER_AUGMENTATIONS if a not in OVERLAPPING_AUGMENTATIONS],
  }
  return out


def alternate_towers() -> tuple[str, ...]:
  """The CSD variants in the tower form that is not the default (for the comparison)."""
  other = "deep" if DEFAULT_TOWERS == "matched" else "matched"
  return tuple(f"{name}_{other}" for name in CSD_NAMES)


def comparison_methods() -> tuple[str, ...]:
  """The rows that compare CSD with variants of itself, not with other methods (the
  ``comparisons`` profile of configs/ood.py): CSD-Aug without the transforms that generate
  evaluated OOD sets, and the tower form that is not the default."""
  return ("csd_aug_no_overlap",) + alternate_towers()


def small_budget(name: str, num_steps: int, batch_size: int = 64) -> dict:
  """Overrides that shrink method ``name`` to a tiny budget (tests, the ``:quick`` config
  profiles): every network (classifier, members, CSD's g, RND) trains ``num_steps`` steps of
  ``batch_size``; MC dropout takes 4 passes and Laplace 16 samples."""
  over: dict = {"train": {"num_steps": num_steps, "batch_size": batch_size}}
  if name.startswith("csd"):
    over["num_steps"] = num_steps
    if methods().get(name, {}).get("towers") == "deep":
      over.update(batch_size=batch_size, context_batch_size=batch_size)
  if name == "mc_dropout":
    over["num_passes"] = 4
  if name == "laplace":
    over["num_samples"] = 16
  if name == "bnn_mcmc":
    over.update(
        num_burnin=num_steps // 2, thin=max(1, num_steps // 8), num_samples=4, batch_size=batch_size
    )
  return over
