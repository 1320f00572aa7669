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


# (binary, bad arguments, what the one-line error must say)
BAD_FLAGS = [
    ("rl.main", ["--total_steps=0"], "--total_steps must be positive"),
    ("rl.main", ["--gamma=1.5"], "--gamma must be in (0, 1]"),
    ("rl.main", ["--env=atari"], "--env"),
    ("rl.main", ["--out_dir=/proc/csd_jax_test"], "is not a writable folder"),
    ("benchmarks.ood", ["--methods=csd,nope"], "unknown 'nope'"),
    ("benchmarks.ood", ["--dataset=imagenet"], "--dataset"),
    ("benchmarks.ood", ["--seeds=0"], "--seeds must be positive"),
    ("benchmarks.ood", ["--download"], "--download only applies to --dataset=tfds"),
    ("benchmarks.ood", ["--dataset=tfds", "--data_dir=/no/such/dir"], "no such tfds data folder"),
    ("benchmarks.ood", ["--overrides={oops"], "--overrides is not JSON"),
    ("benchmarks.throughput", ["--ensemble_sizes=3,0"], "list of positive integers"),
    ("benchmarks.kernel_ceiling", ["--layers=dense,fc9"], "--layers must be"),
    ("benchmarks.kernel_ceiling", ["--ridges=1e-6,0"], "--ridges must be"),
    ("benchmarks.exploration", ["--agents=dqn,ppo"], "unknown 'ppo'"),
    ("benchmarks.exploration", ["--sizes=10,-2"], "list of positive integers"),
    ("validation.ensemble", ["--ensemble_members=1"], "--ensemble_members must be >= 2"),
    ("validation.ntk_check", ["--out_dir=/etc/hostname/sub"], "is not a writable folder"),
    ("rl.main", ["--env_timeout_s=0"], "--env_timeout_s must be positive"),
    ("rl.main", ["--mesh=data=64"], "needs 64 devices"),
    ("benchmarks.ood", ["--checkpoint_every=-5"], "--checkpoint_every must be >= 0"),
    ("rl.main", ["--checkpoint_dir=/proc/csd_ck"], "--checkpoint_dir=/proc/csd_ck is not a writable"),
    ("benchmarks.ood", ["--coordinator_address=localhost:1234"],
     "--coordinator_address needs --num_processes and --process_id"),
    ("benchmarks.ood", ["--distributed", "--mesh=data"], "mesh must look like 'data=8'"),
]


def test_bad_flags_fail_in_one_line_without_traceback():
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  procs = [(case, subprocess.Popen([sys.executable, "-m", case[0], *case[1]], cwd=ROOT, env=env,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
           for case in BAD_FLAGS]
  for (name, args, expected), proc in procs:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 1, (name, args, proc.returncode, err[-1000:])
    assert "Traceback" not in err, (name, args, err[-2000:])
    errors = [line for line in err.splitlines() if line.startswith("FATAL Flags parsing error")]
    assert len(errors) == 1 and expected in errors[0], (name, args, err[-1000:])
