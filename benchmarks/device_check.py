r"""One prepared check of a lent accelerator, in one JSON (BUILD.md, "GPU check").

    bash benchmarks/device_check.sh "$OUT"     # on the GPU machine: this binary under a hard cap
    python -m benchmarks.device_check --out_dir=docs/results/device_check
    python -m benchmarks.device_check --config=configs/device_check.py:dry --out_dir=/tmp/dc

Stages, in ``--config.stages`` order, each under its own time budget (``<stage>.budget_s``):

* ``csd``: deep CSD (the OOD benchmark's ``csd`` method config) fitted with ``csd_jax.fit`` on
  the embedded task (steps/s: median of whole fits after a compiling one, results blocked on),
  ENS(15) (the ``ens15`` method) trained the same way, and inference samples/s of
  ``csd_jax.variance`` and of ENS(15)'s score on one batch of ID test images, round-robin
  (``protocol.timed``: warm-up, ``block_until_ready``, medians); the ratios are of numbers from
  this one run.
* ``tests``: the test files that build meshes or count devices, ``-m 'not slow' -n0``, in a
  pytest process killed past the budget; pass/fail counts from its JUnit XML.
* ``doom``: ``benchmarks.doom_throughput.run_cells`` once per cell (default ``paper:dqn`` and
  ``paper:csd_sa``): agent env steps/s, learning included, and csd_sa's ratio to DQN; each
  cell's own table and plot in ``OUT_DIR/doom/<cell>/``.

A stage that raises (a missing package, an env that fails) is recorded as its error and the
next stage runs. ``OUT_DIR/device_check.json`` is rewritten after every stage, so a process
killed from outside leaves the stages it finished. The heavy modules are imported inside the
stages, so one that does not import on the machine's JAX fails its stage only. Exit status 1
when a stage failed.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import pathlib
import platform
import re
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import xml.etree.ElementTree as ElementTree

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import flags

from cmdline import cli

FLAGS = flags.FLAGS
NAME = "device_check"
ROOT = pathlib.Path(__file__).resolve().parents[1]
STAGES = ("csd", "tests", "doom")


def define_flags() -> flags.FlagHolder:
  """``--out_dir`` and ``--config`` (configs/device_check.py); under ``__main__`` only."""
  return cli.define_out_dir_and_config(NAME, "docs/results/device_check")


def check_config(config: ml_collections.ConfigDict) -> None:
  """Raises ``cli.ConfigError`` naming the first field out of range."""
  cli.check(
      config,
      non_negative=["seed"],
      subset_of={"stages": STAGES},
      positive=[
          "csd.budget_s",
          "csd.max_train",
          "csd.num_steps",
          "csd.batch_size",
          "csd.fit_repeats",
          "csd.ens_members",
          "csd.ens_steps",
          "csd.ens_batch_size",
          "csd.ens_repeats",
          "csd.query_batch",
          "csd.repeats",
          "csd.rounds",
          "tests.budget_s",
          "doom.budget_s",
          "doom.steps",
          "doom.buffer_size",
          "doom.env_timeout_s",
      ],
  )
  if not cli.split_list(config.tests.files):
    raise cli.ConfigError("--config.tests.files is empty")


def _version(package: str) -> str | None:
  try:
    return importlib.metadata.version(package)
  except importlib.metadata.PackageNotFoundError:
    return None


def machine() -> dict:
  """What ran the check: the first device's kind, the backend, the versions that matter."""
  devices = jax.devices()
  return dict(
      device_kind=devices[0].device_kind,
      backend=jax.default_backend(),
      device_count=len(devices),
      devices=[str(d) for d in devices],
      jax_version=jax.__version__,
      jaxlib_version=_version("jaxlib"),
      flax_version=_version("flax"),
      envpool_version=_version("envpool"),
      python_version=platform.python_version(),
      cpu_count=os.cpu_count(),
  )


class Budget:
  """A stage's time budget, counted from its creation."""

  def __init__(self, seconds: float):
    self.seconds, self.start = float(seconds), time.perf_counter()

  def elapsed(self) -> float:
    return time.perf_counter() - self.start

  def left(self) -> float:
    return self.seconds - self.elapsed()


# ----------------------------------------------------------------------------------------------
# Stage csd: deep CSD's fit and inference against ENS(15).
# ----------------------------------------------------------------------------------------------


def _given(**fields) -> dict:
  """The method-config overrides that are set (a None field keeps the method's value)."""
  return {k: v for k, v in fields.items() if v is not None}


# The csd stage's timed fits stop repeating once past this share of its budget, the timed
# ensemble trainings past the second; inference (a few batches) takes the rest.
FIT_SHARE, ENS_SHARE = 0.45, 0.75


def timed_until(fn, repeats: int, deadline: float) -> tuple[float, list[float]]:
  """(median, all) wall-clock seconds of up to ``repeats`` calls of ``fn`` (compiled already;
  results blocked on): at least one, and no further call once the next would end past
  ``deadline`` (a ``time.perf_counter`` value), judged by the last call's time."""
  times = []
  while len(times) < repeats:
    t = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - t)
    if time.perf_counter() + times[-1] > deadline:
      break
  return float(np.median(times)), times


def csd_stage(c: ml_collections.ConfigDict, seed: int, budget: Budget) -> dict:
  """Times the ``csd`` method's fit (``csd_jax.fit``) and ENS(15)'s training, then both scores
  on one query batch; ``c`` is the config's ``csd``."""
  import csd_jax
  from benchmarks import protocol
  from uncertainty_kit import methods
  from uncertainty_kit import train

  task = protocol.embedded_tasks(seed, max_train=c.max_train)[0]
  x_train = jnp.asarray(task.train.images)
  # The ID test images, repeated to fill the batch.
  queries = jnp.asarray(np.resize(task.test.images, (c.query_batch, *task.test.images.shape[1:])))
  key = jax.random.PRNGKey(seed)
  out: dict = dict(
      task=task.name,
      num_train=int(x_train.shape[0]),
      query_batch=int(queries.shape[0]),
      data_seconds=budget.elapsed(),
  )

  cfg = methods.config_for(
      "csd", _given(num_steps=c.num_steps, batch_size=c.batch_size, context_batch_size=c.batch_size)
  )
  model = methods.csd_model(cfg)
  fit_kw = methods.csd_fit_kwargs(cfg)
  steps = fit_kw["num_steps"]
  state = csd_jax.init(model, jax.random.fold_in(key, 1), x_train)
  fit = lambda: csd_jax.fit(model, state, key, x_train, log_every=steps, verbose=False, **fit_kw)[0]
  t = time.perf_counter()
  fitted = jax.block_until_ready(fit())  # compiles; the chunk of ``steps`` is then cached
  first = time.perf_counter() - t
  fit_s, fit_times = timed_until(fit, c.fit_repeats, budget.start + FIT_SHARE * budget.seconds)
  out["fit"] = dict(
      method="csd",
      towers=cfg["towers"],
      **fit_kw,
      loop=csd_jax.fitting.resolve_loop(model),
      first_call_seconds=first,
      seconds=fit_s,
      repeats_seconds=fit_times,
      steps_per_s=steps / fit_s,
      pairs_per_s=steps * fit_kw["batch_size"] * fit_kw["context_batch_size"] / fit_s,
  )

  ens = methods.get("ens15")
  ens_train = _given(num_steps=c.ens_steps, batch_size=c.ens_batch_size)
  ecfg = methods.config_for("ens15", _given(num_members=c.ens_members, train=ens_train or None))
  ens_fit = lambda: ens.fit(jax.random.fold_in(key, 2), task.train, ecfg)
  t = time.perf_counter()
  ens_state = ens_fit()
  jax.block_until_ready(ens_state.arrays)
  ens_first = time.perf_counter() - t
  ens_s, ens_times = timed_until(
      lambda: ens_fit().arrays, c.ens_repeats, budget.start + ENS_SHARE * budget.seconds
  )
  out["ens15_train"] = dict(
      method="ens15",
      num_members=int(ecfg["num_members"]),
      mode=train.resolve_ensemble_mode(ecfg["mode"]),
      num_steps=int(ecfg["train"]["num_steps"]),
      batch_size=int(ecfg["train"]["batch_size"]),
      first_call_seconds=ens_first,
      seconds=ens_s,
      repeats_seconds=ens_times,
  )
  out["csd_vs_ens15_train_speedup"] = ens_s / fit_s

  # Inference on the same batch, round-robin: a load spike hits both alike.
  relative = cfg["score"] == "relative_variance"
  fns = {
      "csd": jax.jit(lambda x: csd_jax.variance(model, fitted, x, relative=relative)[0]),
      "ens15": jax.jit(lambda x: ens.score(ens_state, x)),
  }
  times = {name: [] for name in fns}
  for _ in range(c.rounds):
    for name, fn in fns.items():
      times[name].append(protocol.timed(fn, queries, repeats=c.repeats))
  for name in fns:
    s = float(np.median(times[name]))
    out[f"{name}_inference"] = dict(
        score=cfg["score"] if name == "csd" else ecfg["score"],
        seconds_per_batch=s,
        samples_per_s=queries.shape[0] / s,
        rounds_seconds=times[name],
        repeats=c.repeats,
    )
  out["csd_vs_ens15_inference_speedup"] = (
      out["csd_inference"]["samples_per_s"] / out["ens15_inference"]["samples_per_s"]
  )
  return out


def csd_summary(s: dict) -> str:
  return (
      f"fit {s['fit']['steps_per_s']:.1f} steps/s, ENS train x"
      f"{s['csd_vs_ens15_train_speedup']:.2f}, inference "
      f"{s['csd_inference']['samples_per_s']:.0f}/s (x"
      f"{s['csd_vs_ens15_inference_speedup']:.2f} ENS)"
  )


# ----------------------------------------------------------------------------------------------
# Stage tests: the test files that touch devices.
# ----------------------------------------------------------------------------------------------


def junit_counts(path: str | os.PathLike) -> dict:
  """Counts (tests, passed, failed, errors, skipped) and the failing test ids of a JUnit XML."""
  root = ElementTree.parse(path).getroot()
  suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
  counts = {
      k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")
  }
  failing = [
      f"{case.get('classname')}::{case.get('name')}"
      for case in root.iter("testcase")
      if case.find("failure") is not None or case.find("error") is not None
  ]
  return dict(
      tests=counts["tests"],
      failed=counts["failures"],
      errors=counts["errors"],
      skipped=counts["skipped"],
      passed=counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"],
      failing=failing,
  )


def tests_stage(c: ml_collections.ConfigDict, budget: Budget) -> dict:
  """pytest over ``c.files`` in its own process group, killed when the budget runs out."""
  files = cli.split_list(c.files)
  with tempfile.TemporaryDirectory() as tmp:
    xml = os.path.join(tmp, "junit.xml")
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-m",
        "not slow",
        "-n0",
        "-p",
        "no:cacheprovider",
        f"--junitxml={xml}",
        *files,
    ]
    if c.select:
      cmd += ["-k", c.select]
    # This process holds the accelerator: its children allocate memory as they need it.
    env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false")
    # Its own process group (not session): killed as one below, and with this process's
    # session by whoever ends that.
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        process_group=0,
    )
    try:
      output, _ = proc.communicate(timeout=max(budget.left(), 1.0))
      timed_out = False
    except subprocess.TimeoutExpired:
      os.killpg(proc.pid, signal.SIGKILL)  # pytest and the test's own subprocesses
      output, _ = proc.communicate()
      timed_out = True
    lines = output.strip().splitlines()
    out = dict(
        command=" ".join(cmd[1:]).replace(xml, "JUNIT.xml"),
        files=files,
        select=c.select,
        returncode=proc.returncode,
        timed_out=timed_out,
        summary=lines[-1] if lines else "",
    )
    if os.path.exists(xml):
      out.update(junit_counts(xml))
  if timed_out or proc.returncode != 0:
    out["output_tail"] = "\n".join(lines[-40:])
  if timed_out:
    raise StageError(f"pytest passed its {budget.seconds:.0f} s budget", out)
  if "tests" not in out:  # pytest writes its report last: the process itself ended early
    raise StageError(
        f"pytest exited with {proc.returncode} before writing its report (a test process "
        f"that exits, or XLA refusing a flag in XLA_FLAGS); last line: {out['summary']!r}",
        out,
    )
  if proc.returncode != 0 or not out["tests"]:
    raise StageError(f"pytest exited with {proc.returncode}: {out['summary']}", out)
  return out


def tests_summary(s: dict) -> str:
  return f"{s['passed']} passed, {s['failed'] + s['errors']} failed, {s['skipped']} skipped"


# ----------------------------------------------------------------------------------------------
# Stage doom: agent env steps/s of VizDoom cells.
# ----------------------------------------------------------------------------------------------


def doom_stage(
    c: ml_collections.ConfigDict, seed: int, budget: Budget, out_dir: pathlib.Path
) -> dict:
  """``doom_throughput.run_cells`` per cell of ``c.cells`` (its config with this stage's steps,
  replay, variant and env timeout; its files in ``out_dir/<cell>``, other than word characters, '.'
  and '-' as '_'); csd_sa's
  (and every agent's) ratio to its setting's DQN."""
  from benchmarks import doom_throughput
  from configs import doom_throughput as doom_configs
  from rl import game_guard
  from rl import watchdog

  cells = cli.split_list(c.cells)
  doom_throughput.parse_cells(cells)
  rows, skipped, last = [], [], 0.0
  out: dict = dict(
      cells=cells,
      steps=int(c.steps),
      buffer_size=int(c.buffer_size),
      variant=c.variant,
      rows=rows,
      skipped=skipped,
  )
  for cell in cells:
    if rows and budget.left() < last:
      skipped.append(cell)
      continue
    config = doom_configs.get_config()
    config.update(
        dict(
            cells=cell,
            seed=seed,
            variant=c.variant,
            steps=int(c.steps),
            paper_steps=int(c.steps),
            buffer_size=int(c.buffer_size),
            env_timeout_s=float(c.env_timeout_s),
        )
    )
    t = time.perf_counter()
    try:
      cell_dir = out_dir / re.sub(r"[^\w.-]", "_", cell)
      row = doom_throughput.run_cells(config, cell_dir, verbose=False)["rows"][0]
    except watchdog.EnvFailure as e:
      game_guard.kill_all_games()  # a hung env's games would outlive the process
      out["env_failure"] = True
      raise StageError(f"{cell}: {e}", out) from e
    last = time.perf_counter() - t
    rows.append({k: v for k, v in row.items() if not k.startswith("ratio_to")} | dict(seconds=last))
  doom_throughput.add_setting_dqn_ratios(rows)
  if skipped:
    raise StageError(f"budget spent before {', '.join(skipped)}", out)
  return out


def doom_summary(s: dict) -> str:
  return ", ".join(f"{r['cell']} {r['sps']:.1f} steps/s" for r in s["rows"])


# ----------------------------------------------------------------------------------------------
# The run.
# ----------------------------------------------------------------------------------------------


class StageError(RuntimeError):
  """A stage that failed after measuring something: ``partial`` goes into its record."""

  def __init__(self, message: str, partial: dict):
    super().__init__(message)
    self.partial = partial


def write(path: pathlib.Path, result: dict) -> None:
  """The JSON, atomically (a kill never leaves half a file)."""
  tmp = path.with_suffix(f".tmp{os.getpid()}")
  tmp.write_text(json.dumps(result, indent=1, sort_keys=True, default=float))
  os.replace(tmp, path)


def run(config: ml_collections.ConfigDict, out_dir: str | os.PathLike, log=print) -> dict:
  """Runs the stages of ``config``; writes (after each stage) and returns the result."""
  check_config(config)
  out = pathlib.Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  path = out / f"{NAME}.json"
  t0 = time.perf_counter()
  result = dict(
      machine(),
      stages={},
      ok=True,
      config=cli.to_dict(config),
      started=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
  )
  stage_fns = {
      "csd": (lambda b: csd_stage(config.csd, int(config.seed), b), csd_summary),
      "tests": (lambda b: tests_stage(config.tests, b), tests_summary),
      "doom": (lambda b: doom_stage(config.doom, int(config.seed), b, out / "doom"), doom_summary),
  }
  for name in cli.split_list(config.stages):
    fn, summary = stage_fns[name]
    budget = Budget(config[name].budget_s)
    try:
      record = dict(fn(budget), ok=True)
      line = summary(record)
    except Exception as e:  # noqa: BLE001  (any failure is the stage's result; the next runs)
      record = dict(
          getattr(e, "partial", {}),
          ok=False,
          error=f"{type(e).__name__}: {e}",
          traceback=traceback.format_exc(limit=-4),
      )
      line = f"FAILED {record['error'][:300]}"
      result["ok"] = False
    record.update(
        budget_s=budget.seconds,
        seconds=budget.elapsed(),
        over_budget=budget.elapsed() > budget.seconds,
    )
    result["stages"][name] = record
    result["wall_seconds"] = time.perf_counter() - t0
    write(path, result)
    log(
        f"[{time.perf_counter() - t0:6.1f}s] {name} ({record['seconds']:.1f}s of "
        f"{budget.seconds:.0f}s): {line}"
    )
  log(f"wrote {path}")
  return result


def main(argv, config: ml_collections.ConfigDict):
  cli.start(argv, config, FLAGS.out_dir, NAME, check_config)
  result = run(config, FLAGS.out_dir, log=lambda line: print(line, flush=True))
  sys.stdout.flush()
  sys.stderr.flush()
  # After an env failure envpool's threads may never end, and exit waits for them.
  status = 0 if result["ok"] else 1
  if result["stages"].get("doom", {}).get("env_failure"):
    os._exit(status)
  sys.exit(status)


if __name__ == "__main__":
  config_flag = define_flags()
  cli.run(lambda argv: main(argv, config_flag.value))
