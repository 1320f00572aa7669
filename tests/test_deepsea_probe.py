"""benchmarks.deepsea_probe: the greedy rollout, the right/left reading, the replay's visits, and
(slow) a probed run whose margins choose the actions that ``rl.dqn.act`` chooses."""

from __future__ import annotations

import json
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks import deepsea_probe
from cmdline import cli
from configs import deepsea_probe as probe_configs


def test_check_names_what_the_probe_cannot_read():
  with pytest.raises(cli.ConfigError, match="state-action agents .*csd_sa.*not 'dqn'"):
    deepsea_probe.check(probe_configs.get_config("dqn"))
  config = probe_configs.get_config()
  config.probe_every = 0
  with pytest.raises(cli.ConfigError, match="probe_every must be positive"):
    deepsea_probe.check(config)


def test_greedy_path_moves_right_where_the_margin_is_positive():
  margin = np.ones((4, 4))
  np.testing.assert_array_equal(deepsea_probe.greedy_path(margin), [1, 2, 3, 4])
  margin[1, 1] = -1.0  # leaves the diagonal on the second move, then climbs back
  np.testing.assert_array_equal(deepsea_probe.greedy_path(margin), [1, 0, 1, 2])
  np.testing.assert_array_equal(deepsea_probe.greedy_path(-np.ones((3, 3))), [0, 0, 0])


def test_right_left_follows_the_action_mapping():
  values = np.arange(8.0).reshape(2, 2, 2)  # (row, column, action)
  mapping = np.array([[0, 1], [1, 0]])
  right, left = deepsea_probe.right_left(values, mapping)
  np.testing.assert_array_equal(right, [[0.0, 3.0], [5.0, 6.0]])
  np.testing.assert_array_equal(left, [[1.0, 2.0], [4.0, 7.0]])


def test_replay_visits_counts_valid_rows_of_written_slots():
  size = 2
  obs = np.zeros((3, 2, size * size), np.uint8)  # (T, E, N²): 3 slots, 2 written
  obs[0, 0, 0] = obs[0, 1, 3] = obs[1, 0, 3] = obs[2, 0, 1] = 1  # slot 2 is unwritten
  valid = np.array([[True, True], [True, False], [True, True]])
  obs[1, 1, 2] = 1  # an invalid row (an auto-reset step) does not count
  replay = types.SimpleNamespace(obs=obs, valid=valid, count=2)
  np.testing.assert_array_equal(deepsea_probe.replay_visits(replay, size), [[1, 0], [0, 2]])


def test_below_visited_averages_the_visited_cells_under_the_diagonal():
  visits = np.array([[60, 0, 0], [50, 99, 0], [49, 70, 0]])
  prior_right = np.arange(9.0).reshape(3, 3)
  maps = dict(visits=visits, prior_right=prior_right, prior_left=-2 * prior_right)
  # cells (1, 0) and (2, 1): the diagonal and the cell seen 49 times do not count
  out = deepsea_probe.below_visited(maps)
  assert out["below_visited_cells"] == 2
  assert out["below_visited_prior"] == np.mean([3.0, 7.0, -6.0, -14.0])
  none = deepsea_probe.below_visited(dict(maps, visits=np.zeros((3, 3), int)))
  assert none["below_visited_cells"] == 0 and np.isnan(none["below_visited_prior"])


@pytest.mark.slow
def test_probe_margins_pick_the_actions_the_agent_takes(tmp_path):
  config = probe_configs.get_config()
  config.run.size, config.episodes, config.probe_every = 5, 120, 40
  result = deepsea_probe.run_probe(config, tmp_path, verbose=False)
  assert all(p["episodes"] >= 40 * (i + 1) for i, p in enumerate(result["probes"]))
  saved = json.loads((tmp_path / "probe.json").read_text())
  assert saved["probes"][-1]["greedy_right_moves"] == result["probes"][-1]["greedy_right_moves"]
  assert (tmp_path / "probe.png").exists()

  run = deepsea_probe.check(config)
  cfg = deepsea_probe.deepsea.learner_config(run)
  loop, _ = deepsea_probe.deepsea.initial_loop(run, cfg)
  agent = loop.agent
  mapping = deepsea_probe.action_mapping(run.size, run.mapping_seed)
  margin = deepsea_probe.probe(cfg, loop, run.size, mapping)["maps"]["margin"]
  obs = deepsea_probe.cell_observations(run.size)
  heads = jnp.zeros(obs.shape[0], jnp.int32)
  acts = deepsea_probe.dqn.act(
      cfg, agent.learner, heads, obs, agent.env_steps, jax.random.PRNGKey(0)
  )
  moves_right = np.asarray(acts).reshape(run.size, run.size) == mapping
  np.testing.assert_array_equal(moves_right, margin > 0)
