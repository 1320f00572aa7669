"""DeepSea seeds as one program (rl.deepsea.train_seeds): each seed's records are its one-seed
run's, the group resumes from its checkpoint, its seed axis shards over 8 simulated devices, and
the exploration grid runs a cell's seeds as one group."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from benchmarks import exploration
from configs import deepsea as deepsea_configs
from configs import exploration as exploration_configs
from conftest import simulated_devices_env
from csd_jax import checkpoint
from rl import deepsea
from rl import run_config
from cmdline import cli

ROOT = Path(__file__).resolve().parents[1]
# What differs between a seed's summary in a group and its one-seed run's: timings, and the group
TIMING = ("sps", "env_sps", "wall_s", "seed_group")


def tiny(agent: str, **fields):
  """DeepSea-5 with small nets, learning from the first steps (tests/test_rl_drivers.py's), as
  the checked run."""
  config = deepsea_configs.get_config(agent)
  config.update(dict(size=5, chunk_steps=25, log_every=500, checkpoint_every=0, plot=False))
  config.dqn.update(
      dict(num_envs=4, batch_size=64, learning_starts=64, buffer_size=4000, q_widths=(32, 32))
  )
  if agent == "csd_sa":
    config.csd.update(dict(prior_width=64, tower_widths=(32,), embed_dim=16))
  config.update(fields)
  return run_config.from_config(run_config.DeepSea, config)


def final_state(folder: Path):
  mngr = checkpoint.manager(folder)
  step = mngr.latest_step()
  return mngr.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore()))["state"]


def assert_close_states(one, group, index: int) -> None:
  """The one-seed run's final state against seed ``index`` of the group's: integers (counters,
  replay contents, keys) equal, floats to float32 rounding grown over a few hundred updates."""
  for a, b in zip(jax.tree.leaves(one), jax.tree.leaves(group)):
    a, b = np.asarray(a), np.asarray(b)[index]
    if a.dtype.kind == "f":
      np.testing.assert_allclose(b, a, rtol=2e-3, atol=2e-5)
    else:
      np.testing.assert_array_equal(b, a)


# csd_sa's bonus and intrinsic head run the same vmapped chunk as dqn's update: slow only.
@pytest.mark.parametrize("agent", ["dqn", pytest.param("csd_sa", marks=pytest.mark.slow)])
def test_seed_group_records_equal_one_seed_runs(tmp_path, agent):
  """Seeds 0-2 (csd_sa: 0-1) as one program: each seed's summary and episodes (returns, successes, end
  steps) are its one-seed run's, a seed stopping early by its own rule included (dqn's seed 1
  reaches the treasure in a few dozen episodes and stops 3 episodes later); the final params
  agree to rounding (XLA:CPU batches the program's reductions and divisions differently:
  rl.dqn.make_seeds_chunk)."""
  # csd_sa's learner compiles slowly: two seeds, fewer steps
  seeds, steps = ([0, 1, 2], 500) if agent == "dqn" else ([0, 1], 300)
  config = tiny(agent, total_steps=steps, stop_after_solved_episodes=3)
  group = deepsea.train_seeds(
      config, str(tmp_path / "group"), seeds=seeds, verbose=False, tensorboard=False
  )
  state = final_state(tmp_path / "group" / "checkpoints")
  ends = []
  for i, seed in enumerate(seeds):
    one = deepsea.train(
        tiny(agent, total_steps=steps, stop_after_solved_episodes=3, seed=seed),
        str(tmp_path / f"one{seed}"),
        verbose=False,
        tensorboard=False,
    )
    strip = lambda s: {k: v for k, v in s.items() if k not in TIMING}
    assert strip(group[i]) == strip(one)
    assert group[i]["seed_group"] == seeds and group[i]["config"]["seed"] == seed
    episodes = lambda d: json.loads((d / "episodes.json").read_text())
    assert episodes(tmp_path / "group" / f"seed{seed}") == episodes(tmp_path / f"one{seed}")
    assert_close_states(final_state(tmp_path / f"one{seed}" / "checkpoints"), state, i)
    ends.append(one["env_steps"])
  if agent == "dqn":
    assert ends[1] < 500 <= ends[0]  # seed 1 stopped early, and kept its state from then


def test_seed_group_resumes_and_refuses_another_seed_list(tmp_path):
  """A group checkpointed at 200 env steps and rerun to 400 ends where an uninterrupted group
  ends (bitwise: the same program); its checkpoint names the seed list."""
  straight = deepsea.train_seeds(
      tiny("dqn", total_steps=400),
      str(tmp_path / "straight"),
      seeds=[0, 1],
      verbose=False,
      tensorboard=False,
  )
  first = deepsea.train_seeds(
      tiny("dqn", total_steps=200),
      str(tmp_path / "cut"),
      seeds=[0, 1],
      verbose=False,
      tensorboard=False,
  )
  resumed = deepsea.train_seeds(
      tiny("dqn", total_steps=400),
      str(tmp_path / "cut"),
      seeds=[0, 1],
      verbose=False,
      tensorboard=False,
  )
  assert [s["resumed_from"] for s in resumed] == [s["env_steps"] for s in first]
  for a, b in zip(straight, resumed):
    assert a["episodes"] == b["episodes"] and a["env_steps"] == b["env_steps"]
    assert a["return_last_100"] == b["return_last_100"]
  for a, b in zip(
      jax.tree.leaves(final_state(tmp_path / "straight" / "checkpoints")),
      jax.tree.leaves(final_state(tmp_path / "cut" / "checkpoints")),
  ):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  with pytest.raises(cli.ConfigError, match="seeds saved"):
    deepsea.train_seeds(
        tiny("dqn", total_steps=400),
        str(tmp_path / "cut"),
        seeds=[0, 2],
        verbose=False,
        tensorboard=False,
    )


def test_num_seeds_config_and_errors(tmp_path):
  config = tiny("dqn", seed=3, num_seeds=2)
  assert deepsea.seeds_of(config) == [3, 4]
  one = deepsea.seed_config(config, 4)
  assert one.seed == 4 and one.num_seeds == 1 and config.num_seeds == 2
  with pytest.raises(cli.ConfigError, match="train_seeds"):
    deepsea.train(config, str(tmp_path), verbose=False)
  with pytest.raises(cli.ConfigError, match="seeds=8"):
    deepsea.seed_sharding("data=2", 4)
  with pytest.raises(cli.ConfigError, match="divide evenly"):
    deepsea.seed_sharding("seeds=2", 3)


_SHARDED_SCRIPT = textwrap.dedent("""
    import sys
    import jax, jax.numpy as jnp, numpy as np
    sys.path.insert(0, "tests")
    from test_deepsea_seeds import tiny
    from rl import deepsea, dqn
    assert jax.device_count() == 8, jax.devices()
    config = tiny("dqn")
    cfg = deepsea.learner_config(config)
    seeds = list(range(8))
    active = jnp.asarray([True] * 7 + [False])    # the last seed stopped: it keeps its state
    sharding = deepsea.seed_sharding("data=1,seeds=8", len(seeds))
    out = {}
    for label, place in (("one device", lambda t: t), ("8 devices", lambda t: jax.device_put(t, sharding))):
      loops, env_step = deepsea.initial_loops(config, cfg, seeds)
      chunk = dqn.make_seeds_chunk(cfg, env_step, config.chunk_steps)
      start = jax.device_get(loops.agent.env_steps)
      loops = place(loops)
      recs = []
      for _ in range(6):
        loops, rec = chunk(loops, active)
        recs.append(jax.device_get(rec))
      if label == "8 devices":
        assert len(loops.agent.learner.params["params"]["net"]["head"]["kernel"].sharding
                   .device_set) == 8
        assert loops.agent.env_steps.sharding.is_equivalent_to(sharding, 1)
      out[label] = (jax.device_get(loops), recs, start)
    (a, ra, start), (b, rb, _) = out["one device"], out["8 devices"]
    assert int(a.agent.env_steps[-1]) == int(start[-1]) and int(a.agent.env_steps[0]) == 6 * 25 * 4
    worst = 0.0
    for x, y in zip(jax.tree.leaves((a, ra)), jax.tree.leaves((b, rb))):
      x, y = np.asarray(x), np.asarray(y)
      if x.dtype.kind == "f":
        worst = max(worst, float(np.max(np.abs(x - y), initial=0.0)))
        np.testing.assert_allclose(y, x, rtol=1e-4, atol=1e-6)
      else:
        np.testing.assert_array_equal(y, x)
    print("max abs difference", worst)
    print("OK")
""")


def test_sharded_seed_axis_equals_one_device():
  """Eight seeds (one stopped) on an 8-device mesh ("seeds" axis): the state stays sharded over
  the devices through the jitted chunks, and every seed's records and state are the one-device
  group's (integers equal; floats printed, to rounding)."""
  env = simulated_devices_env(8)
  proc = subprocess.run(
      [sys.executable, "-c", _SHARDED_SCRIPT],
      env=env,
      capture_output=True,
      text=True,
      timeout=600,
      cwd=ROOT,
  )
  assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
  assert "OK" in proc.stdout
  print(proc.stdout)


@pytest.mark.slow  # the grid's code path; the seed group itself is tested above
def test_exploration_grid_runs_a_cells_seeds_as_one_group(tmp_path):
  """The grid's cells of one (agent, size) run as a seed group (their summaries say so); a
  cell that holds an older grid's one-seed checkpoint resumes alone."""
  config = exploration_configs.get_config()
  config.update(
      dict(
          agents="dqn",
          sizes="4",
          seeds=3,
          max_episodes=30,
          stop_after_solved_episodes=3,
          total_steps=1,
          plot=False,
          log_every=500,
      )
  )
  config.runs.dqn.chunk_steps = 25
  config.runs.dqn.dqn.update(
      dict(num_envs=4, batch_size=64, learning_starts=64, buffer_size=4000, q_widths=(32, 32))
  )
  # seed 2's folder holds a one-seed run cut short (an interrupted older grid)
  cell = exploration.cell_config(config, "dqn", 4, 2)
  cut = dataclasses.replace(cell, total_steps=100)
  deepsea.train(
      cut, str(tmp_path / "deepsea" / "dqn" / "size4" / "seed2"), verbose=False, tensorboard=False
  )
  (tmp_path / "deepsea" / "dqn" / "size4" / "seed2" / "summary.json").unlink()
  result = exploration.run_grid(config, tmp_path, verbose=False, tensorboard=False)
  cells = result["cells"]["dqn"]["4"]
  assert [c["seed"] for c in cells] == [0, 1, 2]
  assert cells[0]["seed_group"] == cells[1]["seed_group"] == [0, 1]
  assert "seed_group" not in cells[2] and cells[2]["resumed_from"] == 100
  assert (tmp_path / "deepsea" / "dqn" / "size4" / "seeds0_1" / "checkpoints").is_dir()
  assert result["finished_seeds"]["dqn"]["4"] == 3 and not result["missing_cells"]
