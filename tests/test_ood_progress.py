"""The OOD benchmark's ETA: the cells left, costed by method (benchmarks.ood_progress)."""

import pytest

from benchmarks import ood_progress
from configs import ood as ood_config
from cmdline import cli


def _default_run():
  """The README's main job: every default method's cost, and its cells in run order (one seed,
  two tasks; the alternate towers run on seed 0, so on both)."""
  config = ood_config.get_config()
  names = config.methods.split(",")
  costs = ood_progress.cell_costs(names, {n: cli.freeze(config.method[n]) for n in names})
  return names, costs, names * 2


def test_eta_after_the_first_cell_is_its_seconds_per_cost_times_the_cost_left():
  names, costs, planned = _default_run()
  first = planned[0]
  eta = ood_progress.eta_seconds(planned[1:], {first: 120.0}, costs)
  cost_left = sum(costs[n] for n in planned[1:])
  assert eta == pytest.approx(120.0 * cost_left / costs[first])
  # The rate in cells (every cell as long as the first, a deep CSD fit) overestimates it: most
  # cells are cheaper than a deep CSD fit.
  assert eta < 0.6 * 120.0 * len(planned[1:])


def test_a_measured_method_costs_its_latest_cell_and_the_rest_the_pooled_rate():
  costs = {"csd": 6000.0, "ens15": 4600.0, "laplace": 100.0}
  seconds = {"csd": 80.0, "laplace": 10.0}
  eta = ood_progress.eta_seconds(["csd", "ens15", "laplace", "laplace"], seconds, costs)
  assert eta == pytest.approx(80.0 + 4600.0 * (80.0 + 10.0) / (6000.0 + 100.0) + 2 * 10.0)


def test_no_eta_before_a_cell_is_computed():
  assert ood_progress.eta_seconds(["csd"], {}, {"csd": 1.0}) is None
  assert ood_progress.format_seconds(None) == "?"
  assert ood_progress.format_seconds(75.4) == "01:15"
  assert ood_progress.format_seconds(3725) == "1:02:05"


def test_cell_cost_follows_the_budget():
  config = ood_config.get_config()
  cost = lambda name, **over: ood_progress.cell_cost(
      name, cli.freeze({**cli.to_dict(config.method[name]), **over})
  )
  overhead = ood_progress.CELL_OVERHEAD
  assert cost("csd", num_steps=2400) - overhead == pytest.approx(2 * (cost("csd") - overhead))
  assert cost("ens15") - overhead == pytest.approx(5 * (cost("ens3") - overhead))
  assert cost("ntkgp_exact") == cost("laplace") == overhead
  # ENS(15)'s fifteen members are the dearest cell, then the deep CSD fits; the closed form the
  # cheapest
  _, costs, _ = _default_run()
  assert sorted(costs, key=costs.get, reverse=True)[:4] == ["ens15", "csd", "csd_aug", "csd_ood"]
  assert min(costs.values()) == overhead


def test_a_larger_ensemble_after_a_smaller_one_costs_only_its_new_members():
  config = ood_config.get_config()
  configs = {n: cli.freeze(config.method[n]) for n in ("ens3", "ens15")}
  alone = {n: ood_progress.cell_cost(n, configs[n]) for n in configs}
  overhead = ood_progress.CELL_OVERHEAD
  member = (alone["ens3"] - overhead) / 3
  costs = ood_progress.cell_costs(["ens3", "ens15"], configs)
  assert costs["ens3"] == alone["ens3"]
  assert costs["ens15"] == pytest.approx(overhead + 12 * member)
  assert ood_progress.cell_costs(["ens15", "ens3"], configs)["ens3"] == overhead
  other = {
      **configs,
      "ens15": cli.replace(configs["ens15"], train={**configs["ens15"]["train"], "lr": 1e-3}),
  }
  assert ood_progress.cell_costs(["ens3", "ens15"], other)["ens15"] == alone["ens15"]


def test_loaded_cells_leave_the_eta_unmeasured(capsys):
  progress = ood_progress.CellProgress(3, ["csd", "csd"], {"csd": 1.0})
  progress.skip()
  progress.start("csd a seed 0")
  progress.finish("csd", "loaded")
  assert progress.seconds == {} and sum(progress.left.values()) == 1
  progress.start("csd b seed 0")
  progress.finish("csd", "computed")
  assert progress.seconds["csd"] > 0 and sum(progress.left.values()) == 0
  progress.close()
  assert "eta ?" in capsys.readouterr().err
