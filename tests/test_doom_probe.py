"""benchmarks.doom_probe: which head picks a state-action agent's greedy action."""

import json

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import doom_probe
from configs import vizdoom as vizdoom_configs
from csd_jax import checkpoint
from rl import dqn
from rl import run_config
from rl import vizdoom


def test_flip_fractions_count_states_whose_greedy_action_the_bonus_changes():
  q = np.array([[1.0, 0.9], [1.0, 0.0]])
  q_in = np.array([[0.0, 1.0], [0.0, 1.0]])
  # β·q_in adds 0.2 to action 1: only the first state's greedy action changes; a tenth of it none
  assert doom_probe.flip_fractions(q, q_in, 0.2, [0.1, 1.0]) == {0.1: 0.0, 1.0: 0.5}
  np.testing.assert_allclose(doom_probe.gap(np.array([[3.0, 1.0, 0.0]])), [2.0])


def _agent(profile: str):
  """A fresh learner of ``profile`` (``configs/vizdoom.py``) with 5 rows of random frames."""
  config = vizdoom_configs.get_config(profile)
  config.dqn.buffer_size = 256  # 16 rows of 16 envs
  run = run_config.from_config(run_config.VizDoom, config)
  cfg = vizdoom.learner_config(run)
  obs = jnp.zeros((cfg.num_envs, *vizdoom.pixels(run).obs_shape), jnp.uint8)
  agent = dqn.init(cfg, jax.random.PRNGKey(0), obs)
  frames = jax.random.randint(jax.random.PRNGKey(1), agent.replay.obs.shape, 0, 256, jnp.int32)
  replay = agent.replay._replace(obs=frames.astype(jnp.uint8), count=jnp.asarray(5, jnp.int32))
  return config, cfg, agent._replace(replay=replay)


def test_probe_reads_the_saved_learner_as_it_was(tmp_path):
  config, cfg, agent = _agent("csd_sa,cpu")
  manager = checkpoint.manager(tmp_path / "checkpoints")
  checkpoint.save(manager, 300_000, {"agent": agent}, {"env_steps": 300_000})
  (tmp_path / "summary.json").write_text(json.dumps({"config": config.to_dict()}))

  report = doom_probe.probe(tmp_path, 64, [0.0, 1.0])
  assert report == dict(
      run_dir=str(tmp_path), **doom_probe.read(cfg, agent, 300_000, 64, [0.0, 1.0])
  )
  assert report["states"] == 64 and report["flips"][0.0] == 0.0
  assert report["beta"] == float(dqn.beta(cfg, jnp.asarray(300_000)))
  assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["300000"]


def test_an_agent_without_an_intrinsic_head_reports_q_ext_alone():
  _, cfg, agent = _agent("dqn,cpu")
  report = doom_probe.read(cfg, agent, 1000, 32, [1.0])
  assert set(report) == {"env_steps", "states", "ext_gap"} and report["states"] == 32
  assert report["ext_gap"][10] <= report["ext_gap"][50] <= report["ext_gap"][90]
