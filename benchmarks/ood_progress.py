"""The OOD benchmark's progress bar, with an ETA weighted by what each cell's method costs.

Cells of different methods differ in cost by two orders of magnitude (a deep CSD fit against
the closed form), so a rate in cells per second, the bar's usual ETA, follows whichever method
ran last. Here the cells left are costed instead: each at the seconds its method's latest computed
cell took, and the cells of a method not yet run at ``cell_cost`` times the seconds per unit of
cost measured so far (``eta_seconds``).
"""

from __future__ import annotations

import collections
import sys
import time
from typing import Mapping, Sequence

from tqdm import tqdm

from uncertainty_kit import defaults
from uncertainty_kit.baselines import rnd
from uncertainty_kit.baselines import sgld

# Costs are in backbone steps: one training step of one backbone network on a batch of
# ``defaults.TRAIN["batch_size"]`` examples. Per-step costs of the other networks against it, from
# fit seconds per step on an idle CPU (docs/results/ood_headline_job: ENS(15)'s 4,500 member steps
# 53.7 s, deep CSD's 1,200 steps 37.7 s; docs/results/ood_readme_job: RND's 300 steps 6.7 s,
# matched CSD's 3,000 steps 6 s):
DEEP_CSD_STEP = 2.6  # φ and ψ trained (wider dense layers) and the prior's forward pass
RND_STEP = 1.5  # the predictor trained (wider dense layers) and the target's forward pass
MATCHED_CSD_STEP = 0.1  # a linear ψ on cached last-layer features
# Every cell besides its networks' steps: the fits without a training loop (Laplace's GGN, the
# closed form), scoring the test and OOD sets, compiling.
CELL_OVERHEAD = 100.0


def cell_cost(name: str, config) -> float:
  """The expected cost of one cell of method ``name`` under its ``config``, in backbone steps:
  networks trained × steps × each network's per-step cost × batch / ``defaults.TRAIN`` batch, plus
  ``CELL_OVERHEAD``. The classifier the CSD variants, RND, Laplace and the closed form share is
  trained once per task and seed by whichever runs first, so no cell counts it."""
  per_batch = 1.0 / defaults.TRAIN["batch_size"]
  shared = config["train"]
  if "towers" in config:  # the CSD variants
    if config["towers"] == "deep":
      mean_batch = (int(config["batch_size"]) + int(config["context_batch_size"])) / 2
      steps = DEEP_CSD_STEP * int(config["num_steps"]) * mean_batch * per_batch
    else:
      steps = MATCHED_CSD_STEP * int(config["num_steps"])
  elif "num_members" in config:  # deep ensembles
    steps = int(config["num_members"]) * int(shared["num_steps"]) * shared["batch_size"] * per_batch
  elif name == "bnn_mcmc":
    steps = sgld.num_steps(config) * int(config["batch_size"]) * per_batch
  elif name == "rnd":
    b = rnd.budget(config)
    steps = RND_STEP * b["num_steps"] * b["batch_size"] * per_batch
  elif name in ("laplace", "ntkgp_exact"):  # on the shared classifier
    steps = 0.0
  else:  # one network on the shared budget (MC dropout)
    steps = int(shared["num_steps"]) * int(shared["batch_size"]) * per_batch
  return CELL_OVERHEAD + steps


def cell_costs(names: Sequence[str], configs: Mapping[str, object]) -> dict[str, float]:
  """``cell_cost`` of each method in ``names`` (run in that order) under ``configs[name]``,
  with a deep ensemble charged only for the members that no ensemble before it trained: its
  first members are those of a smaller one with the same backbone and budget
  (``train.train_ensemble``)."""
  costs, trained = {}, {}  # trained: (backbone, budget) -> members trained so far
  for name in names:
    config = configs[name]
    costs[name] = cell_cost(name, config)
    if "num_members" in config:
      shared = (repr(config["backbone"]), repr(config["train"]))
      members, before = int(config["num_members"]), trained.get(shared, 0)
      per_member = (costs[name] - CELL_OVERHEAD) / members
      costs[name] = CELL_OVERHEAD + max(members - before, 0) * per_member
      trained[shared] = max(before, members)
  return costs


def eta_seconds(
    left: Sequence[str], seconds: Mapping[str, float], costs: Mapping[str, float]
) -> float | None:
  """Seconds the cells ``left`` (their methods' names, one per cell) are expected to take.

  ``seconds[name]``: the seconds of method ``name``'s latest computed cell (its first also
  compiles, and may train the shared classifier). A method there costs that per cell; another
  costs ``costs[name]`` × the seconds per unit of cost over the methods there. None before any
  cell was computed."""
  measured_cost = sum(costs[name] for name in seconds)
  if not measured_cost:
    return None
  per_cost = sum(seconds.values()) / measured_cost
  return sum(seconds[name] if name in seconds else costs[name] * per_cost for name in left)


def format_seconds(seconds: float | None) -> str:
  """``h:mm:ss`` or ``mm:ss``; ``?`` for None."""
  if seconds is None:
    return "?"
  m, s = divmod(int(round(seconds)), 60)
  h, m = divmod(m, 60)
  return f"{h}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"


class CellProgress:
  """A bar over ``total`` cells on stderr, showing ``eta_seconds`` of the cells not finished.

  ``planned``: the method name of every cell that will run (cells skipped by the run are in
  ``total`` only); ``costs``: ``cell_cost`` by method name. Only "computed" cells are
  measured: "loaded" and "restored" ones skip the fit."""

  def __init__(self, total: int, planned: Sequence[str], costs: Mapping[str, float]):
    self.left = collections.Counter(planned)
    self.costs = dict(costs)
    self.seconds: dict[str, float] = {}  # by method: its latest computed cell
    self.started, self.label = time.perf_counter(), ""
    self.bar = tqdm(
        total=total,
        desc="ood cells",
        unit="cell",
        file=sys.stderr,
        bar_format="{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]",
    )

  def start(self, label: str) -> None:
    """A cell begins: ``label`` says what runs."""
    self.started, self.label = time.perf_counter(), label
    self.bar.set_postfix_str(self._postfix())

  def finish(self, name: str, status: str) -> None:
    """The cell begun last, of method ``name``, ended with ``status``."""
    if status == "computed":
      self.seconds[name] = time.perf_counter() - self.started
    self.left[name] -= 1
    self.bar.set_postfix_str(self._postfix(), refresh=False)
    self.bar.update(1)

  def _postfix(self) -> str:
    eta = eta_seconds(list(self.left.elements()), self.seconds, self.costs)
    return f"eta {format_seconds(eta)}, {self.label}"

  def skip(self) -> None:
    """A cell the run leaves out (not in ``planned``)."""
    self.bar.update(1)

  def close(self) -> None:
    self.bar.close()
