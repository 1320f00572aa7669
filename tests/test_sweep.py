"""benchmarks.sweep: its table ranks settings best first and shows every pair."""

from benchmarks import sweep


def test_markdown_ranks_settings_best_first():
  res = {
      "default": {"overrides": {}, "auroc": 0.8, "auroc_se": 0.01, "by_score": {"variance": 0.7},
                  "fit_seconds": 12.0, "per_pair": {"d:a": 0.9, "d:b": 0.7}},
      "lr3e-3": {"overrides": {"lr": 3e-3}, "auroc": 0.9, "auroc_se": 0.02, "by_score": {},
                 "fit_seconds": None, "per_pair": {"d:a": 0.95, "d:b": 0.85}},
  }
  text = sweep.to_markdown("csd", res, [100])
  rows = [line for line in text.splitlines() if line.startswith("| ") and "`" in line]
  assert rows[0].startswith("| lr3e-3 |") and rows[1].startswith("| default |")
  assert "| 90.0 ± 2.0 |" in rows[0] and "variance 70.0" in rows[1]
  assert "| 95.0 | 85.0 |" in rows[0]
  assert "a (d)" in text and "seeds 100" in text
