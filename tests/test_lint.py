"""Static check: no undefined names anywhere in the packages (pyflakes).

Some code paths only run in long binary runs (e.g. the tower-comparison skip of
benchmarks.ood at seed >= 1), where a misspelt name would surface after minutes; pyflakes finds
it at once.
"""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_no_undefined_names():
  proc = subprocess.run([sys.executable, "-m", "pyflakes", "csd_jax", "uncertainty_kit", "rl", "benchmarks",
                         "validation", "tests"], cwd=ROOT, capture_output=True, text=True,
                        timeout=300)
  problems = [line for line in proc.stdout.splitlines()
              if "undefined name" in line or "syntax error" in line.lower()]
  assert not problems, "\n".join(problems)
