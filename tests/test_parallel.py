"""Data parallelism: a CSD fit on 1 device and on a 4-device mesh agree."""

import os
import subprocess
import sys
import textwrap

import pytest

from csd_jax import parallel

_SCRIPT = textwrap.dedent("""
    import jax, jax.numpy as jnp, numpy as np
    from csd_jax import csd, models, parallel
    assert jax.device_count() == 4, jax.devices()
    x = jax.random.normal(jax.random.PRNGKey(0), (64, 3))
    q = 3 * jax.random.normal(jax.random.PRNGKey(1), (32, 3))
    results = {}
    for label, mesh_spec in [("one", "data=1"), ("four", "data=4"), ("none", None)]:
      for towers in ("matched", "free"):
        tower = None if towers == "matched" else models.MLPSpec(widths=(32,))
        model = csd.CSD(prior=models.MLPSpec(widths=(64,)), feature_net=tower,
                        context_net=tower, embed_dim=16)
        state = csd.init(model, jax.random.PRNGKey(2), x)
        mesh = None if mesh_spec is None else parallel.make_mesh(mesh_spec)
        state, _ = csd.fit(model, state, jax.random.PRNGKey(3), x, num_steps=40,
                           batch_size=16, log_every=20, mesh=mesh, verbose=False)
        results[(label, towers)] = np.asarray(csd.variance(model, state, q)[0])
    for towers in ("matched", "free"):
      ref = results[("none", towers)]
      for label in ("one", "four"):
        err = np.max(np.abs(results[(label, towers)] - ref) / np.abs(ref).max())
        print(towers, label, err)
        assert err < 1e-5, (towers, label, err)
    print("OK")
""")


def test_fit_agrees_on_1_and_4_devices():
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4",
             JAX_PLATFORMS="cpu")
  out = subprocess.run([sys.executable, "-c", _SCRIPT], env=env, capture_output=True,
                       text=True, timeout=600)
  assert out.returncode == 0, out.stdout + out.stderr
  assert "OK" in out.stdout


def test_parse_mesh():
  assert parallel.parse_mesh("data=8") == {"data": 8}
  with pytest.raises(ValueError, match="data=8"):
    parallel.parse_mesh("data=x")
  with pytest.raises(ValueError, match="'data' axis"):
    parallel.parse_mesh("model=2")
  with pytest.raises(ValueError, match="devices"):
    parallel.make_mesh("data=4096")
