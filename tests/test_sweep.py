"""benchmarks.sweep: its table ranks settings best first and shows every pair."""

import pytest

from benchmarks import sweep
from configs import sweep as sweep_config
from cmdline import cli


def test_markdown_ranks_settings_best_first():
  res = {
      "default": {
          "overrides": {},
          "auroc": 0.8,
          "auroc_se": 0.01,
          "by_score": {"variance": 0.7},
          "fit_seconds": 12.0,
          "per_pair": {"d:a": 0.9, "d:b": 0.7},
      },
      "lr3e-3": {
          "overrides": {"lr": 3e-3},
          "auroc": 0.9,
          "auroc_se": 0.02,
          "by_score": {},
          "fit_seconds": None,
          "per_pair": {"d:a": 0.95, "d:b": 0.85},
      },
  }
  text = sweep.to_markdown("csd", res, [100])
  rows = [line for line in text.splitlines() if line.startswith("| ") and "`" in line]
  assert rows[0].startswith("| lr3e-3 |") and rows[1].startswith("| default |")
  assert "| 90.0 ± 2.0 |" in rows[0] and "variance 70.0" in rows[1]
  assert "| 95.0 | 85.0 |" in rows[0]
  assert "a (d)" in text and "seeds 100" in text


def test_config_settings_are_checked_before_any_fit():
  config = sweep_config.get_config("csd")
  settings = sweep.check_config(config)
  assert list(settings)[0] == "default" and settings["default"] == {}
  assert settings["lr_3e_3"] == {"lr": 3e-3}
  for name in ("csd", "rnd"):  # every profile names fields its method has
    sweep.check_config(sweep_config.get_config(name))
  config.settings.bad = {"num_stepz": 5}
  with pytest.raises(cli.ConfigError, match=r"--config\.settings\.bad: .*num_stepz"):
    sweep.check_config(config)
  config = sweep_config.get_config()
  config.tune_seeds = "100,x"
  with pytest.raises(cli.ConfigError, match=r"--config\.tune_seeds"):
    sweep.check_config(config)
