"""Data parallelism on simulated CPU devices: CSD fits and DQN updates agree with one device.

The default suite compares no mesh with an 8-device mesh (each mesh size costs its own
compilations); the slow tests add meshes of 1 and 2 devices."""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import simulated_devices_env
from csd_jax import parallel

ROOT = Path(__file__).resolve().parents[1]

_CSD_SCRIPT = textwrap.dedent("""
    import sys
    import jax, jax.numpy as jnp, numpy as np
    from csd_jax import csd, fitting, models, parallel
    assert jax.device_count() == 8, jax.devices()
    x = jax.random.normal(jax.random.PRNGKey(0), (64, 3))
    q = 3 * jax.random.normal(jax.random.PRNGKey(1), (32, 3))
    meshes = {"none": None, **{n: f"data={n}" for n in sys.argv[1:]}}
    for towers in ("matched", "free"):
      tower = None if towers == "matched" else models.MLPSpec(widths=(32,))
      model = csd.CSD(prior=models.MLPSpec(widths=(64,)), feature_net=tower,
                      context_net=tower, embed_dim=16)
      results = {}
      for label, spec in meshes.items():
        state = csd.init(model, jax.random.PRNGKey(2), x)
        mesh = None if spec is None else parallel.make_mesh(spec)
        state, _ = fitting.fit(model, state, jax.random.PRNGKey(3), x, num_steps=40,
                           batch_size=16, log_every=20, mesh=mesh, verbose=False)
        results[label] = np.asarray(csd.variance(model, state, q)[0])
      ref = results["none"]
      for label in meshes:
        err = np.max(np.abs(results[label] - ref) / np.abs(ref).max())
        print("csd", towers, label, f"{err:.2e}")
        assert err < 1e-5, (towers, label, err)
    print("OK")
""")

_DQN_SCRIPT = textwrap.dedent("""
    import dataclasses, sys
    import jax, jax.numpy as jnp, numpy as np
    sys.path.insert(0, "tests")
    from test_rl_agents import deep_sea_config, filled_state
    from csd_jax import parallel
    from rl import dqn
    assert jax.device_count() == 8, jax.devices()
    agent, sizes = sys.argv[1], [int(n) for n in sys.argv[2:]]
    agent, per = agent.removesuffix("+per"), agent.endswith("+per")
    cfg = deep_sea_config(agent, batch_size=32, bonus_recent_rows=8, prioritized=per)
    state = filled_state(cfg, steps=30)
    key = jax.random.PRNGKey(7)
    ref = None
    for n in (None, *sizes):
      c = cfg if n is None else dataclasses.replace(cfg, mesh=parallel.make_mesh(f"data={n}"))
      learner = state.learner if n is None else parallel.replicate(c.mesh, state.learner)
      buf = state.replay if n is None else parallel.replicate(c.mesh, state.replay)
      out, out_buf, _ = jax.jit(lambda l, b, k: dqn.update(c, l, b, k))(learner, buf, key)
      leaves = [np.asarray(v) for v in jax.tree.leaves((out.params, out.bonus_state,
                                                        out_buf.priority))]
      if ref is None:
        ref = leaves
        continue
      err = max(float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(b))), 1e-12))
                for a, b in zip(leaves, ref))
      print("dqn", sys.argv[1], n, f"{err:.2e}")
      assert err < 1e-5, (agent, n, err)
    print("OK")
""")


def _run_on_8_devices(script: str, *args: str) -> str:
  out = subprocess.run(
      [sys.executable, "-c", script, *args],
      env=simulated_devices_env(8),
      capture_output=True,
      text=True,
      timeout=600,
      cwd=ROOT,
  )
  assert out.returncode == 0, out.stdout + out.stderr[-3000:]
  assert "OK" in out.stdout
  return out.stdout


@pytest.mark.parametrize("sizes", [("8",), pytest.param(("1", "2"), marks=pytest.mark.slow)])
def test_csd_fit_agrees_across_meshes(sizes):
  """Matched and free towers; the max relative difference is printed per mesh."""
  print(_run_on_8_devices(_CSD_SCRIPT, *sizes))


@pytest.mark.parametrize(
    "agent, sizes",
    [
        ("csd+per", ("8",)),  # the update of "csd" and the sum tree's priorities
        pytest.param("csd", ("1", "2", "8"), marks=pytest.mark.slow),
        pytest.param("bdqn", ("1", "2", "8"), marks=pytest.mark.slow),
    ],
)
def test_dqn_update_agrees_across_meshes(agent, sizes):
  """One learner update (Q-network, target, bonus; bdqn: heads, priors, masks; +per: the
  prioritised replay's sum tree after the priorities are written back) per mesh."""
  print(_run_on_8_devices(_DQN_SCRIPT, agent, *sizes))


def test_parse_mesh():
  assert parallel.parse_mesh("data=8") == {"data": 8}
  with pytest.raises(ValueError, match="data=8"):
    parallel.parse_mesh("data=x")
  with pytest.raises(ValueError, match="'data' axis"):
    parallel.parse_mesh("model=2")
  with pytest.raises(ValueError, match="devices"):
    parallel.make_mesh("data=4096")
