r"""Agent env steps/s of the VizDoom settings and agents, side by side in one run.

    python -m benchmarks.doom_throughput --out_dir=docs/results/doom_throughput

Each cell ``setting:agent`` is one short ``rl.vizdoom`` run of that profile
(``configs/vizdoom.py``) on MyWayHome, with the run-config fields that ``@field=value`` sets
(``cpu:dqn@dqn.prioritized=True``, ``cpu:csd_sa@bonus.shares_torso=True``): learning starts as
soon as replay holds an n-step batch,
and ``sps`` times the ``steps`` env steps after the first (compiling) update, so it counts
acting, the env, replay and every update. ``env_sps`` is the raw env under random actions.
Writes ``doom_throughput.json`` (per cell: sps, env_sps, the ratios to the ``nature:dqn`` cell,
the first cell's rate, and to the same setting's ``dqn``) and ``doom_throughput.png``.
"""

from __future__ import annotations

import json
import pathlib
import tempfile
from typing import NamedTuple

import jax
import matplotlib
import ml_collections
from absl import app
from absl import flags
from absl import logging

from configs import vizdoom as vizdoom_configs
from rl import agents
from rl import run_config
from rl import vizdoom
from cmdline import cli

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the file-only backend)

FLAGS = flags.FLAGS
NAME = "doom_throughput"


def define_flags() -> flags.FlagHolder:
  """``--out_dir`` and ``--config`` (configs/doom_throughput.py); under ``__main__`` only."""
  return cli.define_out_dir_and_config(NAME)


class Cell(NamedTuple):
  setting: str
  agent: str
  overrides: tuple[tuple[str, str], ...] = ()  # (dotted run-config field, value as written)

  @property
  def name(self) -> str:
    return f"{self.setting}:{self.agent}" + "".join(f"@{k}={v}" for k, v in self.overrides)


def parse_cells(cells) -> list[Cell]:
  """``"setting:agent[@field=value...]"`` strings -> ``Cell``s; ``@`` sets a field of the run
  config as ``--config.<field>=<value>`` would (e.g. ``cpu:csd_sa@bonus.pool=6``). A
  ``cli.ConfigError`` on a bad cell; a bad field or value fails in ``cell_config``."""
  out = []
  for cell in cli.split_list(cells):
    head, *fields = cell.split("@")
    setting, _, agent = head.partition(":")
    overrides = tuple(tuple(f.partition("=")[::2]) for f in fields)
    if (
        setting not in agents.SETTINGS
        or agent not in agents.AGENTS
        or any(not k or not v for k, v in overrides)
    ):
      raise cli.ConfigError(
          f"--config.cells: {cell!r} is not setting:agent[@field=value...] with setting in "
          f"{', '.join(agents.SETTINGS)}, agent in {', '.join(agents.NAMES)}"
      )
    out.append(Cell(setting, agent, overrides))
  if not out:
    raise cli.ConfigError("--config.cells is empty")
  return out


def cell_config(config: ml_collections.ConfigDict, cell: Cell) -> run_config.VizDoom:
  """The ``rl.vizdoom`` run of one timed cell, checked: the profile ``agent,setting`` with the
  cell's fields set, learning from the first full n-step batch, ``steps`` (``paper_steps``)
  timed env steps after it, no checkpoints or plots."""
  run = vizdoom_configs.get_config(f"{cell.agent},{cell.setting}")
  for field, value in cell.overrides:
    cli.set_field(run, field, value)
  d = run.dqn
  d.buffer_size = int(config.buffer_size)
  d.learning_starts = (d.n_step + 2) * d.num_envs
  steps = config.paper_steps if cell.setting == "paper" else config.steps
  run.update(
      dict(
          variant=config.variant,
          seed=int(config.seed),
          plot=False,
          checkpoint_every=0,
          env_timeout_s=float(config.env_timeout_s),
          total_steps=d.learning_starts + d.num_envs + int(steps),
      )
  )
  run.log_every = run.total_steps
  return run_config.from_config(run_config.VizDoom, run)


def add_setting_dqn_ratios(rows: list[dict]) -> None:
  """Sets each row's ``ratio_to_setting_dqn``: its sps over that of the first ``dqn`` row of
  the same setting and replay (prioritised or not); None without one."""
  for r in rows:
    dqn_row = next(
        (
            d
            for d in rows
            if d["setting"] == r["setting"]
            and d["agent"] == "dqn"
            and d["prioritized"] == r["prioritized"]
        ),
        None,
    )
    r["ratio_to_setting_dqn"] = r["sps"] / dqn_row["sps"] if dqn_row else None


def run_cells(
    config: ml_collections.ConfigDict, out_dir: str | pathlib.Path, verbose: bool = True
) -> dict:
  """Times every cell; returns (and writes) the table."""
  out = pathlib.Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  rows = []
  for cell in parse_cells(config.cells):
    run = cell_config(config, cell)
    with tempfile.TemporaryDirectory() as tmp:
      s = vizdoom.train(run, tmp, tensorboard=False, verbose=False)
    row = dict(
        cell=cell.name,
        setting=cell.setting,
        agent=cell.agent,
        sps=s["sps"],
        prioritized=bool(run.dqn.prioritized),
        shares_torso=bool(run.bonus is not None and run.bonus.shares_torso),
        overrides=dict(cell.overrides),
        env_sps=s["env_sps"],
        timed_steps=run.total_steps - run.dqn.learning_starts,
        updates=s["updates"],
        num_envs=run.dqn.num_envs,
        obs_shape=list(vizdoom.pixels(run).obs_shape),
        frame_skip=run.pixels.frame_skip,
        batch_size=run.dqn.batch_size,
        updates_per_step=run.dqn.updates_per_step,
    )
    rows.append(row)
    if verbose:
      print(
          f"{row['cell']:>14}: {row['sps']:7.1f} agent env steps/s (raw env "
          f"{row['env_sps']:.0f})",
          flush=True,
      )
  base = next((r for r in rows if r["cell"] == "nature:dqn"), rows[0])
  for r in rows:
    r["ratio_to_" + base["cell"].replace(":", "_")] = r["sps"] / base["sps"]
  add_setting_dqn_ratios(rows)
  result = dict(
      rows=rows,
      baseline=base["cell"],
      backend=jax.default_backend(),
      devices=[str(d) for d in jax.devices()],
      config=cli.to_dict(config),
  )
  (out / f"{NAME}.json").write_text(json.dumps(result, indent=1))
  plot(rows, out / f"{NAME}.png")
  return result


def plot(rows: list[dict], path: pathlib.Path) -> None:
  """A horizontal bar per cell: agent env steps/s (log scale)."""
  fig, ax = plt.subplots(figsize=(6, 0.45 * len(rows) + 1.2))
  names = [r["cell"] for r in rows][::-1]
  ax.barh(names, [r["sps"] for r in rows][::-1], color="tab:blue")
  ax.set_xscale("log")
  ax.set_xlabel("agent env steps / s (learning included)")
  ax.set_title(f"VizDoom MyWayHome throughput ({jax.default_backend()})")
  for i, r in enumerate(rows[::-1]):
    ax.text(r["sps"], i, f" {r['sps']:.0f}", va="center", fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def main(argv, config: ml_collections.ConfigDict):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  logging.set_verbosity(logging.WARNING)
  parse_cells(config.cells)
  cli.check(
      config,
      positive=["steps", "paper_steps", "buffer_size", "env_timeout_s"],
      non_negative=["seed"],
      one_of={"variant": agents.VARIANTS},
  )
  cli.record(FLAGS.out_dir, NAME, config)
  vizdoom.exit_on_env_failure(NAME, lambda: run_cells(config, FLAGS.out_dir))


if __name__ == "__main__":
  config_flag = define_flags()
  cli.run(lambda argv: main(argv, config_flag.value))
