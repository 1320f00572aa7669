"""``benchmarks.sweep``: one method, named settings (overrides of its config), tuning seeds.

    python -m benchmarks.sweep --config=configs/sweep.py:csd --out_dir=out/sweep_csd
    python -m benchmarks.sweep --config.method=rnd --config.tune_seeds=100 --out_dir=...

A setting is a name and the fields it changes in ``methods.config_for(method)``; the method's
defaults always run too, as "default". New settings: a config file of your own
(``--config=my_sweep.py``), or a profile here; an existing one's values can be overridden
(``--config.settings.steps_1200.num_steps=1500``).
"""

import ml_collections

# Settings around each method's defaults, one profile per method: the fields the deep-CSD and
# RND sweeps of docs/results.md varied.
PROFILES = {
    "csd": {
        "pixel_normalised": {"normalize_inputs": "pixel"},
        "global_normalised": {"normalize_inputs": "global"},
        "lr_3e_3": {"lr": 3e-3},
        "steps_300": {"num_steps": 300},
        "steps_2400": {"num_steps": 2400},
        "shared_torso": {"shared_torso": True},
    },
    # Levers against plain CSD's weak pairs (faint, thin inputs): biases that break the ReLU
    # nets' positive homogeneity (prior or towers), input standardisation, width, output size,
    # schedule.
    "csd_levers": {
        "prior_bias_1": {"prior_net": {"b_std": 1.0}},
        "towers_bias_1": {"tower": {"b_std": 1.0}},
        "pixel_normalised": {"normalize_inputs": "pixel"},
        "towers_512_embed_512": {"tower": {"widths": [512, 512]}, "embed_dim": 512},
        "steps_2400": {"num_steps": 2400},
        "lr_3e_3_steps_600": {"lr": 3e-3, "num_steps": 600},
        "prior_width_1024": {"prior_net": {"widths": [1024]}},
        "embed_64": {"embed_dim": 64},
        "global_normalised": {"normalize_inputs": "global"},
        # Distance-preserving towers (SNGP, DDU): each hidden layer's spectral norm set to c,
        # and with residual connections where a layer keeps its input's shape.
        "towers_sn_1": {"tower": {"spectral_norm": 1.0}},
        "towers_sn_3": {"tower": {"spectral_norm": 3.0}},
        "towers_residual_sn_0_9": {"tower": {"spectral_norm": 0.9, "residual": True}},
        "towers_residual": {"tower": {"residual": True}},
    },
    # The two levers that gained on both tuning seeds, together.
    "csd_combined": {
        "steps_2400_towers_512": {
            "num_steps": 2400,
            "tower": {"widths": [512, 512]},
            "embed_dim": 512,
        },
    },
    "rnd": {
        "lr_1e_3": {"lr": 1e-3},
        "normalise_none": {"normalize_inputs": "none"},
        "normalise_global": {"normalize_inputs": "global"},
        "steps_1000": {"num_steps": 1000},
    },
}


# Profiles that sweep another method than their name.
METHOD_OF = {"csd_levers": "csd", "csd_combined": "csd"}


def get_config(profile: str | None = None) -> ml_collections.ConfigDict:
  """No settings but the defaults, or ``profile`` (a name in ``PROFILES``): its method (the
  profile's name, or ``METHOD_OF``) and its recorded settings."""
  if profile not in (None, "", *PROFILES):
    raise ValueError(
        f"unknown profile {profile!r} of configs/sweep.py; valid: " f"{', '.join(PROFILES)}"
    )
  config = ml_collections.ConfigDict()
  config.method = METHOD_OF.get(profile, profile) or "csd"  # uncertainty_kit.methods.METHODS
  config.tune_seeds = "100,101"  # seeds of the tuning fits: the table uses 0 .. seeds − 1
  config.num_test = 1000  # held-out examples per ID set and seed
  config.settings = ml_collections.ConfigDict(PROFILES.get(profile, {}))
  return config
