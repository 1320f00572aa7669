"""Every absl binary can be imported next to the others, and each one parses its own flags.

The binaries share flag names (``--out_dir``, ``--seed``, ``--quick``) with different defaults, so
importing a binary must define no flag: each defines its flags in ``define_flags()``, called under
``__main__``. A module-level ``flags.DEFINE_*`` in one of them makes the import test fail with
absl's ``DuplicateFlagError`` (the failure CI once hit when the tests imported ``rl.main`` and
``validation.common`` into one process).
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

from absl import flags

ROOT = Path(__file__).resolve().parents[1]
BINARIES = ("validation.ntk_check", "validation.single_query", "validation.ensemble",
            "validation.contextual", "benchmarks.ood", "benchmarks.throughput",
            "benchmarks.exploration", "rl.main")
PACKAGES = ("csd_jax", "validation", "benchmarks", "rl")


def test_importing_every_binary_defines_no_flag():
  before = set(flags.FLAGS)
  for name in BINARIES:
    module = importlib.import_module(name)
    assert callable(getattr(module, "define_flags", None)) or name.startswith("validation."), name
  ours = {name: flags.FLAGS.find_module_defining_flag(name)
          for name in set(flags.FLAGS) - before}   # libraries (absl, chex) define their own
  ours = {k: m for k, m in ours.items() if m.split(".")[0] in PACKAGES}
  assert not ours, ours


def test_each_binary_parses_its_flags():
  """``--helpfull`` defines and parses every flag of the binary, in a process of its own.

  absl prints the help and exits with status 1; a flag defined twice would end in a traceback.
  """
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  procs = {name: subprocess.Popen([sys.executable, "-m", name, "--helpfull"], cwd=ROOT, env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
           for name in BINARIES}
  for name, proc in procs.items():
    out, err = proc.communicate(timeout=300)
    assert proc.returncode in (0, 1) and "Traceback" not in err, (name, err[-2000:])
    assert "--out_dir" in out, (name, out[-2000:])
