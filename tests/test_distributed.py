"""Multi-process data parallelism through jax.distributed: two CPU processes on localhost, two
simulated devices each, fit CSD over one 4-device mesh and agree with a single-process fit."""

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_WORKER = textwrap.dedent("""
    import sys
    pid, port = int(sys.argv[1]), sys.argv[2]
    from csd_jax import parallel
    parallel.initialize_distributed(f"localhost:{port}", num_processes=2, process_id=pid)
    import jax, numpy as np
    from csd_jax import csd, models
    x = jax.random.normal(jax.random.PRNGKey(0), (64, 3))
    q = 3 * jax.random.normal(jax.random.PRNGKey(1), (32, 3))
    model = csd.CSD(prior=models.MLPSpec(widths=(64,)))
    out = {}
    for label, mesh in (("global", parallel.make_mesh("data=4")), ("local", None)):
      state = csd.init(model, jax.random.PRNGKey(2), x)
      state, _ = csd.fit(model, state, jax.random.PRNGKey(3), x, num_steps=40, batch_size=16,
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
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2",
             JAX_PLATFORMS="cpu")
  procs = [subprocess.Popen([sys.executable, "-c", _WORKER, str(pid), port], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
           for pid in (0, 1)]
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
