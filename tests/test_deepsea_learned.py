"""benchmarks.deepsea_learned: DeepSea runs side by side by bsuite's learning time."""

import json

import numpy as np
import pytest

from benchmarks import deepsea_learned
from cmdline import cli
from rl import records


def _summary(
    folder, seed, learned, episodes, first=None, size=40, max_episodes=10_000, agent="csd_sa"
):
  summary = dict(
      env="deepsea",
      agent=agent,
      seed=seed,
      size=size,
      bsuite_learned_episode=learned,
      episodes=episodes,
      first_success_episode=first
      if first is not None
      else (None if learned == "missing" else learned),
      config=dict(max_episodes=max_episodes),
  )
  if learned == "missing":  # written before summaries recorded the grade
    del summary["bsuite_learned_episode"]
  d = folder / f"seed{seed}"
  d.mkdir(parents=True)
  (d / "summary.json").write_text(json.dumps(summary))
  return summary


@pytest.mark.parametrize(
    "learned, episodes, first, expected",
    [
        (700, 700, 600, (True, 700)),
        (None, 1000, 950, (True, None)),  # the whole budget, graded
        ("missing", 1000, None, (True, None)),  # the whole budget, no success
        ("missing", 1000, 500, (False, None)),  # successes, grade not recorded
        ("missing", 1000, 901, (True, None)),  # first success too late: 900 misses of <= 1000
        ("missing", 1000, 900, (False, None)),  # 899 misses: 1000 episodes could still learn
        (None, 300, None, (False, None)),  # stopped early without a success
    ],
)
def test_learned_episode_settles_only_what_the_run_decides(
    tmp_path, learned, episodes, first, expected
):
  summary = _summary(tmp_path, 0, learned, episodes, first, max_episodes=1000)
  assert deepsea_learned.learned_episode(summary) == expected


def test_the_late_first_success_bound_is_bsuites():
  """Succeeding in every episode from the first success on, the best a run can do: from
  episode 900 it learns at episode 999 (899 misses), from 901 never within 1,000 episodes."""
  episode = np.arange(1, 1001)
  assert records.bsuite_learned_episode(episode >= 900) == 999
  assert records.bsuite_learned_episode(episode >= 901) is None


def test_learned_fraction_counts_runs_learned_by_each_episode():
  frac = deepsea_learned.learned_fraction([3, None, 5, 3], np.array([0, 3, 4, 5, 100]))
  np.testing.assert_allclose(frac, [0.0, 0.5, 0.5, 0.75, 0.75])


def test_report_keeps_finished_runs_and_compares_labels(tmp_path):
  a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
  for seed in range(4):  # a: 4 of 4 learned
    _summary(a, seed, 100 + seed, 100 + seed)
  _summary(a / "other_size", 9, 50, 50, size=30)  # another size: not read
  _summary(b, 0, None, 10_000, agent="bdqn")  # finished unlearned
  _summary(b, 1, None, 300, first=200, agent="bdqn")  # stopped after a success: undetermined
  _summary(b, 2, None, 10_000, agent="bdqn")
  _summary(b, 3, None, 10_000, agent="bdqn")
  _summary(c, 2, 7_000, 7_000, agent="bdqn")  # overrides b's seed 2
  result = deepsea_learned.report(deepsea_learned.parse_runs([f"csd_sa={a}", f"bdqn={b},{c}"]), 40)
  first, second = result["labels"]["csd_sa"], result["labels"]["bdqn"]
  assert (first["seeds"], first["learned"], first["runs"]) == ([0, 1, 2, 3], 4, 4)
  assert first["learned_episode"] == [100, 101, 102, 103] and "fisher_p_vs_first" not in first
  assert second["seeds"] == [0, 2, 3] and second["learned_episode"] == [None, 7_000, None]
  assert second["undetermined_seeds"] == [1] and second["agent"] == "bdqn"
  assert first["median_learned_episode"] == 101.5 and second["median_learned_episode"] is None
  # Fisher's exact test of [[4, 0], [1, 2]]: of the tables with these margins (hypergeometric
  # 5/35, 20/35, 10/35 for 4, 3, 2 learned in the first row) only the observed one is as unlikely
  np.testing.assert_allclose(second["fisher_p_vs_first"], 5 / 35)
  deepsea_learned.plot(tmp_path / "learned.png", result)
  assert (tmp_path / "learned.png").stat().st_size > 0


@pytest.mark.parametrize(
    "specs, message",
    [
        (["=x"], "expected LABEL=FOLDER"),
        (["a=/no/such/folder"], "is not a folder"),
        (["a={tmp}", "a={tmp}"], "given twice"),
    ],
)
def test_bad_runs_are_refused(tmp_path, specs, message):
  with pytest.raises(cli.ConfigError, match=message):
    deepsea_learned.parse_runs([s.format(tmp=tmp_path) for s in specs])


def test_a_label_mixing_agents_is_refused(tmp_path):
  _summary(tmp_path / "a", 0, 100, 100, agent="bdqn")
  _summary(tmp_path / "b", 1, 100, 100, agent="rnd_sa")
  with pytest.raises(cli.ConfigError, match="one agent's runs, found bdqn, rnd_sa"):
    deepsea_learned.report(deepsea_learned.parse_runs([f"x={tmp_path}"]), 40)


def test_a_label_without_finished_runs_is_refused(tmp_path):
  _summary(tmp_path, 0, None, 10, max_episodes=100)
  with pytest.raises(cli.ConfigError, match="no finished DeepSea-40 runs"):
    deepsea_learned.report(deepsea_learned.parse_runs([f"x={tmp_path}"]), 40)
