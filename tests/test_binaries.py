"""Every absl binary can be imported next to the others, and each one parses its own flags.

The binaries share flag names (``--config``, ``--out_dir``) with different defaults, so importing a
binary must define no flag: each defines its flags in ``define_flags()``, called under
``__main__``. A module-level ``flags.DEFINE_*`` in one of them makes the import test fail with
absl's ``DuplicateFlagError`` when the tests import two binaries into one process.
"""

from __future__ import annotations

import importlib
import json
import textwrap
from pathlib import Path

import pytest
from absl import flags

from conftest import run_python

ROOT = Path(__file__).resolve().parents[1]
BINARIES = (
    "validation.ntk_check",
    "validation.single_query",
    "validation.ensemble",
    "validation.contextual",
    "benchmarks.ood",
    "benchmarks.throughput",
    "benchmarks.kernel_ceiling",
    "benchmarks.scaling",
    "benchmarks.exploration",
    "benchmarks.deepsea_throughput",
    "benchmarks.deepsea_probe",
    "benchmarks.doom_probe",
    "benchmarks.deepsea_learned",
    "rl.deepsea",
    "rl.vizdoom",
)
PACKAGES = ("csd_jax", "uncertainty_kit", "cmdline", "validation", "benchmarks", "rl")


def test_importing_every_binary_defines_no_flag():
  before = set(flags.FLAGS)
  for name in BINARIES:
    module = importlib.import_module(name)
    assert callable(getattr(module, "define_flags", None)) or name.startswith("validation."), name
  ours = {
      name: flags.FLAGS.find_module_defining_flag(name) for name in set(flags.FLAGS) - before
  }  # libraries (absl, chex) define their own
  ours = {k: m for k, m in ours.items() if m.split(".")[0] in PACKAGES}
  assert not ours, ours


# (binary, bad arguments, what the one-line error must say)
BAD_FLAGS = [
    ("benchmarks.doom_probe", ["--run_dirs=/nonexistent"], "summary.json not found"),
    ("benchmarks.deepsea_learned", ["--runs=csd_sa"], "expected LABEL=FOLDER"),
    ("rl.deepsea", ["--config.total_steps=0"], "--config.total_steps must be positive"),
    ("rl.deepsea", ["--config.dqn.gamma=1.5"], "--config.dqn.gamma must be in (0, 1]"),
    ("rl.deepsea", ["--config=configs/deepsea.py:ppo"], "unknown profile 'ppo'"),
    ("rl.deepsea", ["--config.agent=csd"], "pick the agent with its profile"),
    ("rl.deepsea", ["--out_dir=/proc/csd_jax_test"], "is not a writable folder"),
    ("rl.vizdoom", ["--config.variant=hard"], "--config.variant must be one of"),
    ("benchmarks.ood", ["--config.methods=csd,nope"], "--config.methods must be"),
    ("benchmarks.ood", ["--config.dataset=imagenet"], "--config.dataset must be one of"),
    ("benchmarks.ood", ["--config.seeds=0"], "--config.seeds must be positive"),
    (
        "benchmarks.ood",
        ["--config.download=True"],
        "--config.download only applies to --config.dataset=tfds",
    ),
    (
        "benchmarks.ood",
        ["--config.dataset=tfds", "--config.data_dir=/no/such/dir"],
        "no such tfds data folder",
    ),
    ("benchmarks.ood", ["--config.method.csd.num_stepz=5"], "num_stepz"),
    (
        "benchmarks.ood",
        ["--config.method.csd.num_steps=-1"],
        "--config.method.csd.num_steps must be a positive integer, got -1",
    ),
    ("benchmarks.ood", ["--config=configs/ood.py:nope"], "unknown profile 'nope'"),
    (
        "benchmarks.throughput",
        ["--config.ensemble_sizes=3,0"],
        "--config.ensemble_sizes must be a list of positive integers",
    ),
    (
        "benchmarks.throughput",
        ["--config.scaling.target_spearman=0"],
        "--config.scaling.target_spearman must be in (0, 1]",
    ),
    ("benchmarks.kernel_ceiling", ["--config.layers=dense,fc9"], "--config.layers must be"),
    ("benchmarks.kernel_ceiling", ["--config.ridges=1e-6,0"], "--config.ridges must be"),
    ("benchmarks.kernel_ceiling", ["--config=configs/kernel_ceiling.py:huge"], "not 'huge'"),
    ("benchmarks.scaling", ["--config.ns=0"], "--config.ns must be a list of positive integers"),
    ("benchmarks.exploration", ["--config.agents=dqn,ppo"], "--config.agents must be"),
    ("benchmarks.exploration", ["--config.sizes=10,-2"], "list of positive integers"),
    (
        "benchmarks.deepsea_throughput",
        ["--config.first_layers=dense,sparse"],
        "--config.first_layers must be a non-empty comma-separated list",
    ),
    ("validation.ensemble", ["--config.members=1"], "--config.members must be >= 2"),
    ("validation.ensemble", ["--ensemble_members=16"], "Unknown command line flag"),
    ("validation.ntk_check", ["--out_dir=/etc/hostname/sub"], "is not a writable folder"),
    (
        "validation.contextual",
        ["--config.toy_1d.variants=csd,nope"],
        "--config.toy_1d.variants must be",
    ),
    ("validation.single_query", ["--config.widht=3"], "Config error"),
    ("rl.vizdoom", ["--config.env_timeout_s=0"], "--config.env_timeout_s must be positive"),
    ("rl.deepsea", ["--mesh=data=64"], "needs 64 devices"),
    ("benchmarks.ood", ["--config.checkpoint_every=-5"], "--config.checkpoint_every must be >= 0"),
    (
        "rl.deepsea",
        ["--checkpoint_dir=/proc/csd_ck"],
        "--checkpoint_dir=/proc/csd_ck is not a writable",
    ),
    (
        "benchmarks.ood",
        ["--coordinator_address=localhost:1234"],
        "--coordinator_address needs --num_processes and --process_id",
    ),
    ("benchmarks.ood", ["--distributed", "--mesh=data"], "mesh must look like 'data=8'"),
    # a tfds folder (tests/) where the sets were never prepared: one line before any work
    (
        "benchmarks.ood",
        ["--config.dataset=tfds", f"--config.data_dir={ROOT / 'tests'}"],
        "Dataset 'mnist'",
    ),
]


# Runs `python -m <binary> <args>` once per case [binary, args, stand_ins], all from one process:
# it imports every binary's dependencies once (jax and the rest take seconds per process), then
# each case is a forked child that executes its binary as __main__ (runpy, as `python -m` does)
# with stdout and stderr in files, two children at a time. Prints one JSON list of [exit status,
# stdout, stderr] per case, in the order given.
#
# With stand_ins the child runs `BINARY ARGS --distributed` up to the end of its start-up:
# parallel.initialize_distributed prints whether JAX's backends had started (the condition under
# which jax.distributed.initialize refuses to run), and cli.record, main's last step before
# training, prints the setting of the config it records (the grid's: its runs') and ends the run.
# Importing every binary starts no backend, so a child starts as `python -m BINARY` would.
_FORKED_RUNS = textwrap.dedent("""
    import importlib, json, os, runpy, sys, tempfile
    from jax._src import xla_bridge
    from csd_jax import parallel
    from cmdline import cli
    cases = json.loads(sys.argv[1])
    for name in dict.fromkeys(name for name, _, _ in cases):
      importlib.import_module(name)   # defines no flag (test_importing_every_binary_defines_no_flag)

    def initialize(*args):
      print("backends started before initialize:", xla_bridge.backends_are_initialized())

    def record(out_dir, name, config):
      runs = config.runs.values() if "runs" in config else [config]
      print("setting:", ",".join(sorted({run.setting for run in runs})))
      sys.exit(0)

    def start(name, args, stand_ins):
      out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
      sys.stdout.flush(); sys.stderr.flush()
      pid = os.fork()
      if pid == 0:
        os.dup2(out.fileno(), 1); os.dup2(err.fileno(), 2)
        code = 0
        try:
          if stand_ins:
            parallel.initialize_distributed, cli.record = initialize, record
            args = [*args, "--distributed"]
          del sys.modules[name]   # executed afresh as __main__, its imports already loaded
          sys.argv = [name, *args]
          runpy.run_module(name, run_name="__main__", alter_sys=True)
        except SystemExit as e:
          code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException:
          import traceback; traceback.print_exc(); code = 99
        finally:
          sys.stdout.flush(); sys.stderr.flush()
          os._exit(code)
      return pid, out, err

    results, running, pending = [None] * len(cases), {}, list(enumerate(cases))
    while pending or running:
      while pending and len(running) < 2:
        i, case = pending.pop(0)
        pid, out, err = start(*case)
        running[pid] = (i, out, err)
      pid, status = os.wait()
      i, out, err = running.pop(pid)
      out.seek(0); err.seek(0)
      results[i] = [os.waitstatus_to_exitcode(status), out.read().decode(errors="replace"),
                    err.read().decode(errors="replace")]
    print(json.dumps(results))
""")

# Distributed start-ups (the stand-ins above): (binary, args, the setting the run records).
DISTRIBUTED_STARTS = {
    "default": ("rl.vizdoom", [], "cpu"),
    "agent_only": ("rl.vizdoom", ["--config=configs/vizdoom.py:csd_sa"], "cpu"),
    "agent_and_setting": ("rl.vizdoom", ["--config=configs/vizdoom.py:csd_sa,nature"], "nature"),
    "auto_on_the_command_line": (
        "rl.vizdoom",
        ["--config=configs/vizdoom.py:csd_sa,nature", "--config.setting=auto"],
        "cpu",
    ),
    "grid": ("benchmarks.exploration", ["--config=configs/exploration.py:vizdoom"], "cpu"),
    "grid_with_setting": (
        "benchmarks.exploration",
        ["--config=configs/exploration.py:vizdoom,nature"],
        "nature",
    ),
}


@pytest.fixture(scope="module")
def binary_runs(tmp_path_factory):
  """{binary: [(exit status, stdout, stderr)]}: ``--helpfull``, then each of its BAD_FLAGS;
  and {case: (exit status, stdout, stderr)} of DISTRIBUTED_STARTS under ``"distributed"``."""
  cases = [
      [name, args, False]
      for name in BINARIES
      for args in [["--helpfull"]] + [args for n, args, _ in BAD_FLAGS if n == name]
  ]
  out = tmp_path_factory.mktemp("distributed")
  cases += [
      [binary, [*args, f"--out_dir={out / case}"], True]
      for case, (binary, args, _) in DISTRIBUTED_STARTS.items()
  ]
  proc = run_python("-c", _FORKED_RUNS, json.dumps(cases))
  results = {name: [] for name in BINARIES}
  results["distributed"] = {}
  starts = iter(DISTRIBUTED_STARTS)
  for (name, _, stand_ins), result in zip(cases, json.loads(proc.stdout.splitlines()[-1])):
    if stand_ins:
      results["distributed"][next(starts)] = result
    else:
      results[name].append(result)
  return results


def test_each_binary_parses_its_flags(binary_runs):
  """``--helpfull`` defines and parses every flag of the binary, run as ``__main__``.

  absl prints the help and exits with status 1; a flag defined twice would end in a traceback.
  """
  for name in BINARIES:
    returncode, out, err = binary_runs[name][0]
    assert returncode in (0, 1) and "Traceback" not in err, (name, err[-2000:])
    assert "--out_dir" in out, (name, out[-2000:])


def test_bad_flags_fail_in_one_line_without_traceback(binary_runs):
  results = {name: iter(binary_runs[name][1:]) for name in BINARIES}
  for name, args, expected in BAD_FLAGS:
    returncode, _, err = next(results[name])
    assert returncode == 1, (name, args, returncode, err[-1000:])
    assert "Traceback" not in err, (name, args, err[-2000:])
    errors = [line for line in err.splitlines() if line.startswith("FATAL ")]
    assert len(errors) == 1 and expected in errors[0], (name, args, err[-1000:])
    assert "ood cells" not in err, (name, args)  # benchmarks.ood's progress bar: nothing started


@pytest.mark.parametrize("case", DISTRIBUTED_STARTS)
def test_vizdoom_distributed_starts_jax_only_after_initialize(binary_runs, case):
  returncode, out, err = binary_runs["distributed"][case]
  assert returncode == 0, err[-3000:]
  assert out.split("\n")[:2] == [
      "backends started before initialize: False",
      f"setting: {DISTRIBUTED_STARTS[case][2]}",
  ], out
