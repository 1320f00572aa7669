"""Multi-process data parallelism through jax.distributed: two CPU processes on localhost, two
simulated devices each, fit CSD over one 4-device mesh and agree with a single-process fit."""

import socket
import subprocess
import sys
import textwrap

import pytest
from pathlib import Path

from conftest import run_python
from conftest import simulated_devices_env

ROOT = Path(__file__).resolve().parents[1]

_WORKER = textwrap.dedent("""
    import sys
    pid, port = int(sys.argv[1]), sys.argv[2]
    from csd_jax import parallel
    parallel.initialize_distributed(f"localhost:{port}", num_processes=2, process_id=pid)
    import jax, numpy as np
    from csd_jax import csd, models
    from csd_jax import fitting
    x = jax.random.normal(jax.random.PRNGKey(0), (64, 3))
    q = 3 * jax.random.normal(jax.random.PRNGKey(1), (32, 3))
    model = csd.CSD(prior=models.MLPSpec(widths=(64,)))
    out = {}
    for label, mesh in (("global", parallel.make_mesh("data=4")), ("local", None)):
      state = csd.init(model, jax.random.PRNGKey(2), x)
      state, _ = fitting.fit(model, state, jax.random.PRNGKey(3), x, num_steps=40, batch_size=16,
                         log_every=20, mesh=mesh, verbose=False)
      out[label] = np.asarray(csd.variance(model, state, q)[0])
    err = np.max(np.abs(out["global"] - out["local"])) / np.abs(out["local"]).max()
    print("RESULT", pid, jax.process_count(), jax.device_count(), err, flush=True)
""")


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def test_two_process_csd_fit_agrees_with_one_process():
  port = str(_free_port())
  env = simulated_devices_env(2)
  procs = [
      subprocess.Popen(
          [sys.executable, "-c", _WORKER, str(pid), port],
          cwd=ROOT,
          env=env,
          stdout=subprocess.PIPE,
          stderr=subprocess.PIPE,
          text=True,
      )
      for pid in (0, 1)
  ]
  try:
    outs = [p.communicate(timeout=400) for p in procs]
  finally:
    for p in procs:
      p.kill()
  for p, (out, err) in zip(procs, outs):
    assert p.returncode == 0, err[-3000:]
    line = next(l for l in out.splitlines() if l.startswith("RESULT"))
    _, pid, processes, devices, rel = line.split()
    assert (int(processes), int(devices)) == (2, 4), line
    assert float(rel) < 1e-5, line


@pytest.mark.slow  # ~2-3 min on 2 cores: two processes plus the one-process reference
def test_rl_deepsea_as_two_processes_matches_one_process(tmp_path):
  """``rl.deepsea --coordinator_address ... --mesh=data=4`` as 2 processes × 2 CPU devices, one
  shared out_dir (orbax checkpoints collectively), ends with the one-process run's params."""
  import jax
  import numpy as np

  sys.path.insert(0, str(ROOT / "tests"))
  from test_rl_drivers import _final_params  # noqa: E402

  args = [
      "--config=configs/deepsea.py:csd",
      "--config.size=5",
      "--config.total_steps=200",
      "--config.seed=3",
      "--config.dqn.batch_size=16",
      "--config.dqn.learning_starts=64",
      "--config.dqn.q_widths=(16,)",
      "--config.csd.prior_width=64",
      "--config.chunk_steps=25",
      "--config.log_every=100",
      "--config.checkpoint_every=100",
      "--notensorboard",
      "--jax_cache_dir=",
  ]
  port = str(_free_port())
  env = simulated_devices_env(2)
  procs = [
      subprocess.Popen(
          [
              sys.executable,
              "-m",
              "rl.deepsea",
              *args,
              f"--out_dir={tmp_path / 'multi'}",
              f"--coordinator_address=localhost:{port}",
              "--num_processes=2",
              f"--process_id={pid}",
              "--mesh=data=4",
          ],
          cwd=ROOT,
          env=env,
          stdout=subprocess.PIPE,
          stderr=subprocess.PIPE,
          text=True,
      )
      for pid in (0, 1)
  ]
  run_python("-m", "rl.deepsea", *args, f"--out_dir={tmp_path / 'single'}", timeout=600)
  try:
    outs = [p.communicate(timeout=600) for p in procs]
  finally:
    for p in procs:
      p.kill()
  for p, (_, err) in zip(procs, outs):
    assert p.returncode == 0, err[-3000:]
  import orbax.checkpoint as ocp
  from csd_jax import checkpoint

  step_s, one = _final_params(tmp_path / "single")
  mngr = checkpoint.manager(
      tmp_path / "multi" / "checkpoints"
  )  # saved from 4 devices: restore onto this one
  step_m = mngr.latest_step()
  multi = mngr.restore(step_m, args=ocp.args.Composite(state=ocp.args.StandardRestore(one)))[
      "state"
  ]
  assert step_m == step_s == 200
  for a, b in zip(jax.tree.leaves(multi), jax.tree.leaves(one), strict=True):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)
