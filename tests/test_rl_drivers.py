"""End-to-end runs of the RL drivers (rl.deepsea, rl.vizdoom) and the exploration grid
(benchmarks.exploration)."""

from __future__ import annotations

import importlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
import scipy.linalg

from benchmarks import doom_throughput
from benchmarks import exploration
from configs import deepsea as deepsea_configs
from configs import exploration as exploration_configs
from configs import doom_throughput as doom_throughput_configs
from configs import vizdoom as vizdoom_configs
from csd_jax import checkpoint
from rl import agents
from rl import deepsea
from rl import doom_env
from rl import dqn
from rl import game_guard
from rl import networks
from rl import records
from rl import run_config
from rl import vec_env
from rl import vizdoom
from rl import watchdog

from cmdline import cli
from conftest import run_python

REPO = Path(__file__).resolve().parents[1]


def shrink(config, agent: str):
  """Tiny but complete DeepSea learners: 4 envs, small nets, learning from the first steps."""
  config.chunk_steps = 25
  config.dqn.update(
      dict(num_envs=4, batch_size=64, learning_starts=64, buffer_size=4000, q_widths=(32, 32))
  )
  if agent == "csd":
    config.csd.prior_width = 128
  if agent == "bdqn":
    config.bdqn.num_heads = 3
  return config


def small_config(agent: str = "csd", total_steps: int = 1000, **fields):
  config = shrink(deepsea_configs.get_config(agent), agent)
  config.size, config.log_every, config.checkpoint_every = 5, 500, 0
  config.total_steps = total_steps
  config.update(fields)
  return config


def ds(config) -> run_config.DeepSea:
  """The checked DeepSea run of a ``configs/deepsea.py`` config."""
  return run_config.from_config(run_config.DeepSea, config)


def doom(config) -> run_config.VizDoom:
  """The checked VizDoom run of a ``configs/vizdoom.py`` config."""
  return run_config.from_config(run_config.VizDoom, config)


def train_small(tmp_path: Path, config, **kw) -> dict:
  return deepsea.train(ds(config), str(tmp_path / config.agent), verbose=False, **kw)


def test_binary_deepsea_writes_summary(tmp_path):
  out = tmp_path / "run"
  cmd = [
      sys.executable,
      "-m",
      "rl.deepsea",
      "--config=configs/deepsea.py:csd",
      "--config.size=5",
      "--config.total_steps=600",
      "--config.seed=1",
      f"--out_dir={out}",
      "--config.dqn.batch_size=16",
      "--config.dqn.learning_starts=64",
      "--config.dqn.q_widths=(16,)",
      "--config.csd.prior_width=64",
      "--config.chunk_steps=25",
      "--config.log_every=200",
  ]
  proc = subprocess.run(
      cmd,
      cwd=REPO,
      capture_output=True,
      text=True,
      timeout=300,
      env=dict(os.environ, JAX_PLATFORMS="cpu"),
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "sps" in proc.stderr
  summary = json.loads((out / "summary.json").read_text())
  for k in ("solved", "first_success_step", "success_rate_last_100", "sps", "env_sps", "episodes"):
    assert k in summary
  assert summary["episodes"] >= 600 // 6 - 4  # episodes of 5 steps + 1 auto-reset step
  assert summary["env_steps"] >= 600 and summary["sps"] > 0 and summary["env_sps"] > 0
  assert (out / "learning_curve.png").stat().st_size > 0
  assert any((out / "tb").iterdir())
  assert (out / "checkpoints").is_dir()
  assert "--config.seed=1" in (out / "deepsea.flags").read_text().splitlines()
  recorded = json.loads((out / "deepsea.config.json").read_text())
  assert recorded == summary["config"] and recorded["dqn"]["q_widths"] == [16]


# dqn trains in-process in the checkpoint tests and the exploration grid below
@pytest.mark.parametrize(
    "agent",
    [
        pytest.param("dqn", marks=pytest.mark.slow),
        "rnd",
        pytest.param("bdqn", marks=pytest.mark.slow),
    ],
)
def test_train_each_agent_runs(tmp_path, agent):
  s = train_small(tmp_path, small_config(agent, total_steps=500))
  assert s["env_steps"] >= 500 and s["episodes"] > 0
  assert 0.0 <= s["success_rate_last_100"] <= 1.0


def test_small_deepsea_is_learned_by_csd_and_stops_there(tmp_path):
  """DeepSea-5 is easy: CSD learns it (bsuite's criterion) within a few hundred episodes.
  ``stop_when_learned`` ends the run in the chunk where that learning time falls; resumed
  without it, the run goes on to ``total_steps`` with the same learned episode."""
  config = small_config("csd", total_steps=1500, stop_when_learned=True)
  stopped = train_small(tmp_path, config)
  learned = stopped["bsuite_learned_episode"]
  assert learned is not None and stopped["solved"], stopped
  assert stopped["first_success_step"] <= stopped["env_steps"]
  assert stopped["max_right_moves"] == 5  # the treasure takes N right moves
  per_chunk = config.chunk_steps * config.dqn.num_envs // (config.size + 1) + config.dqn.num_envs
  assert learned <= stopped["episodes"] <= learned + per_chunk
  assert stopped["env_steps"] < 1500
  config.stop_when_learned = False
  full = train_small(tmp_path, config)
  assert full["env_steps"] >= 1500 and full["resumed_from"] == stopped["env_steps"]
  assert full["bsuite_learned_episode"] == learned


# dqn.init of DeepSea's csd_sa learner, compiled at XLA:CPU's default optimisation as a real run
# compiles it (the suite's FAST_COMPILE runs LLVM at -O0 and would not see an LLVM-level hang).
_INIT_AT_FULL_OPTIMISATION = """
import jax, jax.numpy as jnp
from configs import deepsea as deepsea_configs
from rl import deepsea, dqn, run_config
config = deepsea_configs.get_config("csd_sa")
config.size = 5
run = run_config.from_config(run_config.DeepSea, config)
cfg = deepsea.learner_config(run)
obs = jnp.zeros((cfg.num_envs, *cfg.obs_shape), jnp.float32).at[:, 0].set(1.0)
dqn.init.lower(cfg, jax.random.PRNGKey(0), obs).compile()
"""


def test_state_action_init_compiles_at_full_optimisation():
  """The one-hot gathers' argmax fused with the materialised (state, action) pairs sent LLVM's
  loop vectorizer into exponential time (minutes for DeepSea-5; dqn.init's barrier): the
  compile must end within the timeout."""
  run_python("-c", _INIT_AT_FULL_OPTIMISATION, timeout=120, XLA_FLAGS="")


def test_right_moves_read_from_returns():
  """bsuite's DeepSea-10 returns: -0.01/N per right move, +1 at the treasure (N right moves)."""
  returns = [0.0, -0.003, -0.009, 1.0 - 0.01, -0.009000001]
  moves = deepsea.right_moves(returns, [0, 0, 0, 1, 0], size=10)
  np.testing.assert_array_equal(moves, [0, 3, 9, 10, 9])


def test_bsuite_learned_episode_counts_missed_episodes_so_far():
  """bsuite's learning time: the first episode at which under 90 % of the episodes so far missed."""
  assert records.bsuite_learned_episode([0] * 9 + [1]) is None  # 9 of 10 missed: not below 0.9
  assert records.bsuite_learned_episode([0] * 9 + [1, 1]) == 11  # 9 of 11
  assert records.bsuite_learned_episode([1, 0, 0]) == 1
  assert records.bsuite_learned_episode([0] * 30 + [1] * 3, threshold=0.9) is None  # 30/33
  assert records.bsuite_learned_episode([0] * 30 + [1] * 4, threshold=0.9) == 34  # 30/34
  assert records.bsuite_learned_episode([0, 0, 0, 1], threshold=0.8) == 4  # 3/4 < 0.8
  assert records.bsuite_learned_episode([]) is None
  with pytest.raises(ValueError, match="one row per episode"):
    records.bsuite_learned_episode([[0, 1]])
  with pytest.raises(ValueError, match="threshold"):
    records.bsuite_learned_episode([0, 1], threshold=0.0)


def test_prioritized_deepsea_run_resumes_with_its_priorities(tmp_path):
  """Prioritised replay through the scanned DeepSea loop: the sum tree is checkpointed with the
  replay, holds the losses written back (not only the entry priority 1), and a rerun with a
  larger total resumes from it."""
  config = small_config("dqn", total_steps=400, checkpoint_every=200)
  config.dqn.prioritized = True
  s1 = train_small(tmp_path, config)
  _, state = _final_params(tmp_path / "dqn")
  leaves = np.asarray(state["loop"]["agent"]["replay"]["priority"]["nodes"])[-(2**12) :]
  # ~100 rows of 4 envs, a sixth of them DeepSea-5's auto-reset rows (never sampleable)
  assert 250 < np.sum(leaves > 0) < 400 and np.sum((leaves > 0) & (leaves != 1.0)) > 100
  config.total_steps = 600
  s2 = train_small(tmp_path, config)
  assert s2["resumed_from"] == s1["env_steps"] and s2["env_steps"] >= 600


def _final_params(out_dir: Path):
  mngr = checkpoint.manager(out_dir / "checkpoints")
  step = mngr.latest_step()
  restored = mngr.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore()))
  return step, restored["state"]


@pytest.mark.slow  # the SIGKILL test below checks the same, bitwise, through the binary
def test_killed_run_resumes_from_checkpoint(tmp_path):
  """Run 400 steps with checkpointing, then rerun with a larger total: it restarts from the
  checkpoint (not from scratch) and ends exactly where an uninterrupted run ends."""
  config = small_config("csd", total_steps=400, checkpoint_every=200)
  s1 = deepsea.train(ds(config), str(tmp_path / "run"), verbose=False)
  assert s1["resumed_from"] is None
  config.total_steps = 800
  s2 = deepsea.train(ds(config), str(tmp_path / "run"), verbose=False)
  assert s2["resumed_from"] == s1["env_steps"]
  assert s2["env_steps"] >= 800 and s2["episodes"] > s1["episodes"]
  # uninterrupted reference
  s_ref = deepsea.train(ds(config), str(tmp_path / "ref"), verbose=False)
  assert s_ref["env_steps"] == s2["env_steps"] and s_ref["episodes"] == s2["episodes"]
  _, a = _final_params(tmp_path / "run")
  _, b = _final_params(tmp_path / "ref")
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-6)


@pytest.mark.slow  # ~60 s (three binary runs); in-process resumes are checked by default below
def test_sigkilled_binary_resumes_to_bitwise_identical_params(tmp_path):
  """rl.deepsea killed with SIGKILL at a random point after its first checkpoint, then rerun
  with the same config, ends with exactly the params of an uninterrupted run (CPU)."""

  def cmd(out):
    return [
        sys.executable,
        "-m",
        "rl.deepsea",
        "--config=configs/deepsea.py:csd",
        "--config.size=5",
        "--config.total_steps=1500",
        "--config.seed=3",
        f"--out_dir={out}",
        "--config.dqn.batch_size=16",
        "--config.dqn.learning_starts=64",
        "--config.dqn.q_widths=(16,)",
        "--config.csd.prior_width=64",
        "--config.chunk_steps=25",
        "--config.log_every=1500",
        "--config.checkpoint_every=100",
        "--notensorboard",
        "--jax_cache_dir=",
    ]

  env = dict(os.environ, JAX_PLATFORMS="cpu")
  killed, ref = tmp_path / "killed", tmp_path / "ref"
  reference = subprocess.Popen(
      cmd(ref), cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
  )
  victim = subprocess.Popen(
      cmd(killed), cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
  )
  deadline = time.time() + 300
  ckpts = killed / "checkpoints"
  while (
      time.time() < deadline
      and victim.poll() is None
      and not (ckpts.is_dir() and any(p.name.isdigit() for p in ckpts.iterdir()))
  ):
    time.sleep(0.05)
  time.sleep(random.Random().uniform(0.0, 1.0))
  assert victim.poll() is None, "the run ended before it could be killed: make it longer"
  victim.send_signal(signal.SIGKILL)
  victim.wait()
  killed_at = max(int(p.name) for p in ckpts.iterdir() if p.name.isdigit())
  assert killed_at < 1500
  resumed = subprocess.run(
      cmd(killed), cwd=REPO, env=env, capture_output=True, text=True, timeout=300
  )
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert "resumed from" in resumed.stderr
  _, err = reference.communicate(timeout=300)
  assert reference.returncode == 0, err[-3000:]
  step_a, a = _final_params(killed)
  step_b, b = _final_params(ref)
  assert step_a == step_b
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.slow
def test_corrupted_checkpoint_falls_back_to_the_previous_one(tmp_path, capsys):
  config = small_config("dqn", total_steps=400, checkpoint_every=200)
  train_small(tmp_path, config)
  ckpts = tmp_path / "dqn" / "checkpoints"
  steps = sorted(int(p.name) for p in ckpts.iterdir() if p.name.isdigit())
  assert len(steps) == 2, steps
  for f in (ckpts / str(steps[-1]) / "state").rglob("*"):  # damage every data file
    if f.is_file():
      f.write_bytes(f.read_bytes()[: len(f.read_bytes()) // 2])
  config.total_steps = 600
  s = train_small(tmp_path, config)
  assert s["resumed_from"] == steps[0]
  assert f"checkpoint {steps[-1]}" in capsys.readouterr().err
  assert (tmp_path / "dqn" / "corrupt_checkpoints" / str(steps[-1])).is_dir()
  assert s["env_steps"] >= 600


@pytest.mark.slow  # ~20 s; resuming from the default checkpoint folder is checked by default
def test_checkpoint_dir_puts_checkpoints_elsewhere_and_resumes_from_there(tmp_path):
  config = small_config("dqn", total_steps=200)
  train_small(tmp_path, config, checkpoint_dir=str(tmp_path / "ck"))
  assert any(p.name.isdigit() for p in (tmp_path / "ck").iterdir())
  assert not (tmp_path / "dqn" / "checkpoints").exists()
  config.total_steps = 400
  assert train_small(tmp_path, config, checkpoint_dir=str(tmp_path / "ck"))["resumed_from"] >= 200


@pytest.mark.slow
def test_resume_refuses_another_config(tmp_path):
  config = small_config("dqn", total_steps=200)
  train_small(tmp_path, config)
  config.total_steps = 400
  config.dqn.learning_rate = 0.1
  with pytest.raises(ValueError, match="different config"):
    train_small(tmp_path, config)


def test_config_of_another_agent_is_refused():
  config = deepsea_configs.get_config("dqn")
  config.agent = "csd"
  with pytest.raises(cli.ConfigError, match="profile"):
    ds(config)
  config = deepsea_configs.get_config("bdqn")
  config.bdqn.mask_prob = 0.0
  with pytest.raises(cli.ConfigError, match=r"--config.bdqn.mask_prob must be in \(0, 1\]"):
    ds(config)


def grid_config():
  config = exploration_configs.get_config()
  config.update(
      dict(
          agents="dqn,csd",
          sizes="4",
          seeds=2,
          max_episodes=40,
          stop_after_solved_episodes=5,
          total_steps=1,
          plot=False,
          log_every=500,
      )
  )
  for agent in ("dqn", "csd"):
    shrink(config.runs[agent], agent)
  return config


def _fields(d: dict, prefix: str = "") -> set[str]:
  return {
      f
      for k, v in d.items()
      for f in (_fields(v, f"{prefix}{k}.") if isinstance(v, dict) else {prefix + k})
  }


@pytest.mark.parametrize("profile", ["deepsea", "vizdoom", "vizdoom,paper"])
def test_grid_cells_get_the_fields_of_their_drivers_configs(profile):
  """A cell's config has exactly the fields of its agent's profile, and the run check accepts it;
  a VizDoom grid without a setting leaves it "auto" (benchmarks.exploration.main decides it
  after start-up), which the cells' check refuses until then."""
  env, _, setting = profile.partition(",")
  module = deepsea_configs if env == "deepsea" else vizdoom_configs
  config = exploration_configs.get_config(profile)
  if env == "deepsea" or setting:
    assert exploration.resolve_setting(config) is config  # nothing to decide: no flags read
  kind = run_config.DeepSea if env == "deepsea" else run_config.VizDoom
  for agent in agents.NAMES:
    size = 10 if env == "deepsea" else None
    if env == "vizdoom" and not setting:
      assert config.runs[agent].setting == agents.AUTO
      with pytest.raises(cli.ConfigError, match="setting is 'auto'.*resolve_setting"):
        exploration.cell_config(config, agent, size, 3)
      continue
    cell = exploration.cell_config(config, agent, size, 3)  # checked as it is converted
    assert _fields(run_config.to_dict(cell)) == _fields(cli.to_dict(module.get_config(agent)))
    assert cell.seed == 3
    if env == "vizdoom":
      assert cell.setting == setting
      assert cell.dqn == run_config.from_config(kind, module.get_config(f"{agent},{setting}")).dqn
  with pytest.raises(ValueError, match="unknown profile 'deepsea,cpu'"):
    exploration_configs.get_config("deepsea,cpu")


def test_a_saved_cell_config_without_later_fields_matches_their_earlier_values():
  current = {
      "seed": 0,
      "dqn": {
          "gamma": 0.99,
          **{k[1]: v for k, v in run_config.ADDED_FIELDS.items() if k[0] == "dqn"},
      },
  }
  saved = {"seed": 0, "dqn": {"gamma": 0.99}}
  assert run_config.same_config(saved, current)
  assert "num_atoms" not in saved["dqn"]  # the saved dict is left alone
  assert not run_config.same_config(saved, {**current, "dqn": {**current["dqn"], "num_atoms": 51}})
  assert not run_config.same_config({"seed": 1, "dqn": {"gamma": 0.99}}, current)
  assert not run_config.same_config({"seed": 0}, current)  # no dqn block to fill
  # a config without the added fields (DeepSea's has no residual) matches itself
  assert run_config.same_config(saved, {"seed": 0, "dqn": {"gamma": 0.99}})
  # fields of other blocks too (the intrinsic head's γ, 0: the extrinsic one)
  with_bonus = {**current, "bonus": {"coef": 0.1, "intrinsic_gamma": 0.0}}
  assert run_config.same_config({**saved, "bonus": {"coef": 0.1}}, with_bonus)
  assert not run_config.same_config(
      {**saved, "bonus": {"coef": 0.1}},
      {**with_bonus, "bonus": {"coef": 0.1, "intrinsic_gamma": 0.9}},
  )
  # how often a run logged or checkpointed is not part of it; its budget is
  assert run_config.same_config(
      {**saved, "log_every": 50_000, "checkpoint_every": 0},
      {**current, "log_every": 20_000, "checkpoint_every": 50_000},
  )
  assert not run_config.same_config(
      {**saved, "max_episodes": 3000}, {**current, "max_episodes": 10_000}
  )


def test_a_run_config_is_converted_once_and_checked_naming_the_field():
  """rl.run_config.from_config: the typed run of a profile (every field, the agent's parts
  only), the same ConfigDict back, and one error naming the first bad field."""
  config = deepsea_configs.get_config("csd")
  run = ds(config)
  assert isinstance(run, run_config.DeepSea) and run.rnd is None and run.bdqn is None
  assert run.bonus.recent == 400 and run.dqn.q_widths == (64, 64)
  assert run_config.config_dict(run).to_dict() == config.to_dict()
  typo = {**config.to_dict(), "dqn": {**config.dqn.to_dict(), "q_widht": (8,)}}
  with pytest.raises(cli.ConfigError, match=r"^--config.dqn.q_widht is not a field"):
    ds(typo)
  config.bonus.intrinsic_gamma = 1.0
  with pytest.raises(cli.ConfigError, match=r"^--config.bonus.intrinsic_gamma must be in \[0, 1\)"):
    ds(config)
  config = vizdoom_configs.get_config("bdqn,cpu")
  config.dqn.num_atoms = 11
  with pytest.raises(cli.ConfigError, match=r"^--config.dqn.num_atoms=11 \(C51\) needs one head"):
    doom(config)


def test_every_profile_holds_the_parts_its_agent_lists():
  for agent in agents.NAMES:
    for config in (
        deepsea_configs.get_config(agent),
        vizdoom_configs.get_config(f"{agent},cpu"),
    ):
      assert {p for p in agents.PARTS if p in config} == set(agents.AGENTS[agent].parts)


def test_a_run_recorded_before_every_profile_held_every_field_resumes():
  """The identity of a DeepSea-8 csd run recorded when its profile held only the fields it set
  (no bonus decay, reward prior or pooling; no towers; no C51 fields) is today's profile's, the
  added fields read as those runs had them; a changed field still differs."""
  saved = {
      "agent": "csd",
      "bonus": {"at_update": True, "center": True, "coef": 0.3, "recent": 400},
      "chunk_steps": 250,
      "csd": {"lr": 1.0, "prior_width": 256},
      "dqn": {
          "adam_eps": 0.00015,
          "batch_size": 128,
          "buffer_size": 100000,
          "eps_end": 0.1,
          "eps_start": 0.1,
          "exploration_fraction": 0.1,
          "gamma": 0.99,
          "importance_exponent": 0.45,
          "learning_rate": 0.001,
          "learning_starts": 512,
          "max_grad_norm": 10.0,
          "n_step": 1,
          "num_envs": 4,
          "prioritized": False,
          "priority_exponent": 0.5,
          "q_widths": [64, 64],
          "target_update_frames": 32,
          "updates_per_step": 1,
      },
      "mapping_seed": 42,
      "num_seeds": 1,
      "seed": 0,
      "size": 8,
  }
  config = deepsea_configs.get_config("csd")
  config.size = 8
  now = run_config.identity(ds(config))
  assert run_config.same_config(saved, now)
  config.bonus.decay_steps = 1000
  assert run_config.config_differences(saved, run_config.identity(ds(config))) == [
      "bonus.decay_steps saved 0, now 1000"
  ]


def test_exploration_grid_writes_json_and_resumes(tmp_path):
  config = grid_config()
  result = exploration.run_grid(config, tmp_path / "grid", verbose=False)
  cell = json.loads(
      (tmp_path / "grid" / "deepsea" / "csd" / "size4" / "seed1" / "summary.json").read_text()
  )
  assert cell["config"]["seed"] == 1 and cell["config"]["csd"]["prior_width"] == 128
  assert set(result["solved_fraction"]) == {"dqn", "csd"}
  assert 0.0 <= result["solved_fraction"]["csd"]["4"] <= 1.0
  assert result["sps_ratio_to_dqn"]["dqn"]["4"] == pytest.approx(1.0)
  moves = result["max_right_moves"]["csd"]["4"]
  assert len(moves) == config.seeds and all(0 <= m <= 4 for m in moves)
  learned = [r["bsuite_learned_episode"] for r in result["cells"]["csd"]["4"]]
  assert len(learned) == config.seeds
  assert result["bsuite_solved_fraction"]["csd"]["4"] == np.mean([e is not None for e in learned])
  assert (tmp_path / "grid" / "exploration.json").exists()
  assert (tmp_path / "grid" / "exploration.png").exists()
  again = exploration.run_grid(config, tmp_path / "grid", verbose=False)
  assert again["grid_wall_s_this_invocation"] < result["grid_wall_s_this_invocation"]
  assert again["solved_fraction"] == result["solved_fraction"]
  # report_only runs nothing: another size's cells are listed as missing
  config.sizes, config.report_only = "4,5", True
  report = exploration.run_grid(config, tmp_path / "grid", verbose=False)
  assert report["solved_fraction"]["csd"]["4"] == result["solved_fraction"]["csd"]["4"]
  assert report["solved_fraction"]["csd"]["5"] is None
  assert report["finished_seeds"]["csd"] == {"4": config.seeds, "5": 0}
  assert len(report["missing_cells"]) == 2 * config.seeds
  assert not (tmp_path / "grid" / "deepsea" / "csd" / "size5").exists()


def test_vizdoom_success_records_rates_and_the_last_quarter(tmp_path):
  """A VizDoom cell's records: frames = env steps x frame skip; the success rate per bin of
  frames; the successes among the episodes that end in the last quarter of the budget."""
  success = [0] * 150 + [1] * 50  # episode i ends at env step 525 (i + 1), 105,000 in all
  (tmp_path / "episodes.json").write_text(
      json.dumps(dict(end_step=[525 * (i + 1) for i in range(200)], success=success, ret=success))
  )
  summary = {"config": {"pixels": {"frame_skip": 4}}}
  frames, won = exploration.episode_records(tmp_path, summary)
  assert frames[0] == 2100 and frames[-1] == 200 * 2100 and won.sum() == 50
  rates = exploration.binned_success_rate(frames, won, np.array([0, 315_001, 420_001, 500_000]))
  assert rates[0] == 0.0 and rates[1] == 1.0 and np.isnan(rates[2])
  # a budget of 84,000 steps (336,000 frames): its last quarter holds the episodes ending after
  # step 63,000 (i >= 120): 80 episodes, of which 50 won
  assert exploration.late_success(frames, won, 4 * 84_000) == (50, 80)
  # a budget of 105,000 steps: tenths of 42,000 frames; the last episode ends at the budget's end
  per_tenth = exploration.successes_per_tenth(
      {("a", None, 3): (frames, won), ("a", None, 4): None}, 4 * 105_000
  )
  assert per_tenth == {"a": {"3": [0] * 7 + [9, 20, 21]}}  # episodes 151-159, 160-179, 180-200
  late = exploration.late_success_rates(
      {("a", None, 0): (50, 51), ("a", None, 1): (0, 40), ("b", None, 0): None}, ["a", "b"]
  )
  assert late["a"]["rates"] == [50 / 51, 0.0] and late["a"]["successes"] == 50
  assert late["a"]["se"] == pytest.approx(np.std([50 / 51, 0.0], ddof=1) / np.sqrt(2))
  assert late["b"]["mean"] is None and late["b"]["episodes"] == 0
  assert exploration.episode_records(tmp_path / "none", {}) is None


@pytest.mark.slow  # ~30 s on 2 cores: two spawned workers each import JAX and compile
def test_exploration_grid_workers_run_cells_in_other_processes(tmp_path):
  """Two worker processes give the same cells as the in-process grid (DeepSea is seeded)."""
  config = grid_config()
  config.agents, config.seeds = "dqn", 2
  serial = exploration.run_grid(config, tmp_path / "serial", verbose=False)
  config.workers = 2
  pooled = exploration.run_grid(config, tmp_path / "pooled", verbose=False)
  for key in ("solved_fraction", "median_episodes_to_first_success"):
    assert pooled[key] == serial[key]
  strip = lambda cells: [
      {k: v for k, v in c.items() if "sps" not in k and "wall" not in k} for c in cells["dqn"]["4"]
  ]
  assert strip(pooled["cells"]) == strip(serial["cells"])


def _envpool_ready() -> bool:
  try:
    importlib.import_module("envpool")
    return True
  except Exception:  # pragma: no cover
    return False


def doom_config(agent: str = "dqn", total_steps: int = 40, **dqn_fields):
  config = vizdoom_configs.get_config(f"{agent},{vizdoom_configs.default_setting()}")
  config.update(dict(total_steps=total_steps, log_every=1000, checkpoint_every=0, plot=False))
  config.dqn.update(dqn_fields)
  return config


@pytest.mark.slow  # ~25 s on 2 CPU cores; the default suite has the csd_sa smoke run
@pytest.mark.skipif(not _envpool_ready(), reason="envpool not available")
def test_doom_dense_smoke(tmp_path):
  """2,000 VizDoom env steps of CSD-DQN (4 envs, small replay) through the Python driver,
  including a resume (envpool restarts, the dangling transition is invalidated)."""
  config = doom_config(
      "csd",
      total_steps=1000,
      num_envs=4,
      buffer_size=2000,
      learning_starts=1000,
      batch_size=8,
      n_step=3,
      updates_per_step=1,
  )
  config.log_every, config.plot = 500, True
  s1 = vizdoom.train(doom(config), str(tmp_path / "doom"), verbose=False)
  assert s1["env_steps"] >= 1000 and s1["env_sps"] > 0
  config.total_steps = 2000
  s2 = vizdoom.train(doom(config), str(tmp_path / "doom"), verbose=False)
  assert s2["resumed_from"] == s1["env_steps"] and s2["env_steps"] >= 2000
  assert s2["sps"] > 0
  assert (tmp_path / "doom" / "summary.json").exists()


@pytest.mark.parametrize("setting", agents.SETTINGS)
def test_vizdoom_settings_build_every_agents_learner(setting):
  for agent in agents.NAMES:
    run = doom(vizdoom_configs.get_config(f"{agent},{setting}"))
    cfg = vizdoom.learner_config(run)
    assert cfg.obs_shape == vizdoom.pixels(run).obs_shape
    assert cfg.obs_shape == ((12, 84, 84) if setting == "nature" else (6, 42, 42))
    assert cfg.state_action == agent.endswith("_sa")
    assert isinstance(cfg.q_spec, networks.ImpalaSpec) == (setting == "paper")
    assert (cfg.context_augment > 0) == (setting == "paper" and agent == "csd_sa")
    assert cfg.num_atoms == (101 if setting == "paper" and cfg.state_action else 1)
  # No setting in the profile: "auto" (cpu's fields) until rl.vizdoom.resolve_setting
  assert vizdoom_configs.get_config("dqn").setting == agents.AUTO
  assert cli.to_dict(vizdoom_configs.get_config("dqn,auto")) == cli.to_dict(
      vizdoom_configs.get_config("dqn")
  )
  assert {**cli.to_dict(vizdoom_configs.get_config("dqn")), "setting": "cpu"} == cli.to_dict(
      vizdoom_configs.get_config("dqn,cpu")
  )


# Builds --config from the command line (as rl.vizdoom's main) and prints, as JSON, the config
# rl.vizdoom.resolve_setting makes of it with configs/vizdoom.py's default_setting() and with a
# stand-in for it that names argv[1].
_RESOLVE = """
import json, sys
from absl import flags
from configs import vizdoom as vizdoom_configs
from rl import vizdoom
from cmdline import cli
setting = sys.argv.pop(1)
cli.define_config("vizdoom")
flags.FLAGS(sys.argv)
default, resolved = vizdoom_configs.default_setting(), vizdoom.resolve_setting(flags.FLAGS.config)
vizdoom_configs.default_setting = lambda: setting
print(json.dumps(dict(default=default, unresolved=cli.to_dict(flags.FLAGS.config),
                      resolved=cli.to_dict(resolved),
                      stand_in=cli.to_dict(vizdoom.resolve_setting(flags.FLAGS.config)))))
"""


def test_resolve_setting_rebuilds_an_auto_profile_keeping_the_overrides(setting="nature"):
  """A profile without a setting ("auto") is rebuilt as default_setting()'s (cpu here; a
  stand-in names another), the command line's --config. overrides applied again; a profile with
  a setting is kept as it is."""
  overrides = ["--config.seed=7", "--config.dqn.batch_size=48", "--config.variant=sparse"]
  proc = subprocess.run(
      [sys.executable, "-c", _RESOLVE, setting, "--config=configs/vizdoom.py:csd_sa", *overrides],
      cwd=REPO,
      capture_output=True,
      text=True,
      timeout=300,
      env=dict(os.environ, JAX_PLATFORMS="cpu"),
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  out = json.loads(proc.stdout.splitlines()[-1])
  assert out["default"] == "cpu" and out["unresolved"]["setting"] == agents.AUTO
  for resolved, name in ((out["resolved"], "cpu"), (out["stand_in"], setting)):
    expected = vizdoom_configs.get_config(f"csd_sa,{name}")
    expected.update(dict(seed=7, variant="sparse"))
    expected.dqn.batch_size = 48
    assert resolved == cli.to_dict(expected)
    doom(cli.ConfigDict(resolved))
  with pytest.raises(cli.ConfigError, match="setting is 'auto'"):
    doom(cli.ConfigDict(out["unresolved"]))
  config = vizdoom_configs.get_config("csd_sa,nature")
  assert vizdoom.resolve_setting(config) is config  # no flags needed: nothing to decide


def test_an_auto_setting_is_refused_before_the_run_folder_is_made(tmp_path):
  """The run check refuses a config whose setting is still "auto", before rl.vizdoom.train: a
  run folder records only the setting that ran, so a resume compares like with like."""
  with pytest.raises(cli.ConfigError, match=r"^--config.setting is 'auto' .*resolve_setting"):
    vizdoom.train(doom(vizdoom_configs.get_config("dqn")), str(tmp_path / "doom"), verbose=False)
  assert not (tmp_path / "doom").exists()


def test_vizdoom_profile_and_pixel_errors():
  with pytest.raises(ValueError, match="unknown setting 'gpu'"):
    vizdoom_configs.get_config("csd_sa,gpu")
  config = vizdoom_configs.get_config("csd_sa,cpu")
  config.pixels.frame_skip = 8
  with pytest.raises(cli.ConfigError, match="frame_skip must divide the 2100-frame"):
    doom(config)
  config = vizdoom_configs.get_config("dqn,cpu")
  config.dqn.spectral_norm = True
  with pytest.raises(cli.ConfigError, match="spectral_norm needs the IMPALA Q-net"):
    doom(config)
  for agent, fields in (
      ("csd_sa", dict(shares_torso=True, intrinsic_pool=3)),
      ("rnd", dict(shares_torso=True)),
      ("csd", dict(intrinsic_pool=3)),
  ):
    config = vizdoom_configs.get_config(f"{agent},cpu")
    config.bonus.update(fields)
    with pytest.raises(cli.ConfigError, match="each need a state-action agent's intrinsic head"):
      doom(config)
  config = deepsea_configs.get_config("csd_sa")
  config.bonus.intrinsic_pool = 2
  with pytest.raises(cli.ConfigError, match="intrinsic_pool > 1 pools frames"):
    ds(config)
  config = deepsea_configs.get_config("csd_sa")
  config.bonus.update(dict(center=False, floor=True))
  with pytest.raises(cli.ConfigError, match="bonus.floor needs --config.bonus.center=True"):
    ds(config)


def test_throughput_cells_set_run_config_fields():
  cells = doom_throughput.parse_cells(
      "cpu:csd_sa@dqn.prioritized=True,nature:dqn,cpu:csd_sa@bonus.intrinsic_pool=1@bonus.pool=3"
  )
  assert cells == [
      ("cpu", "csd_sa", (("dqn.prioritized", "True"),)),
      ("nature", "dqn", ()),
      ("cpu", "csd_sa", (("bonus.intrinsic_pool", "1"), ("bonus.pool", "3"))),
  ]
  assert cells[2].name == "cpu:csd_sa@bonus.intrinsic_pool=1@bonus.pool=3"
  for bad in ("cpu:csd_saa", "cpu:dqn@dqn.prioritized", "cpu:dqn@=1", "gpu:dqn"):
    with pytest.raises(cli.ConfigError, match=r"setting:agent\[@field=value\.\.\.\]"):
      doom_throughput.parse_cells(bad)
  config = doom_throughput_configs.get_config("quick")
  cell = lambda text: doom_throughput.cell_config(config, doom_throughput.parse_cells(text)[0])
  assert cell("cpu:dqn@dqn.prioritized=True").dqn.prioritized
  assert cell("paper:dqn").dqn.prioritized  # the paper's
  assert not cell("cpu:dqn").dqn.prioritized
  run = cell("cpu:csd_sa@bonus.intrinsic_pool=1@bonus.pool=3")
  assert (run.bonus.intrinsic_pool, run.bonus.pool) == (1, 3)
  assert (cell("cpu:csd_sa").bonus.intrinsic_pool, cell("cpu:csd_sa").bonus.pool) == (3, 6)
  assert cell("cpu:csd_sa@bonus.shares_torso=True@bonus.intrinsic_pool=1").bonus.shares_torso
  for bad, message in (
      ("cpu:dqn@dqn.nope=1", "dqn.nope: no such field"),
      ("cpu:csd_sa@bonus.pool=1.5", "bonus.pool"),
      ("cpu:csd_sa@bonus.shares_torso=1", "bonus.shares_torso: needs a value of the type"),
      ("cpu:csd_sa@bonus.intrinsic_pool=0", "bonus.intrinsic_pool"),
  ):
    with pytest.raises(cli.ConfigError, match=message):
      cell(bad)


class _FakeDoom:
  """A stand-in for ``doom_env.DoomVecEnv`` whose step ``fail_at`` raises (``"raise"``) or hangs."""

  def __init__(self, num_envs, fail_at=None, how="raise"):
    view = vizdoom.pixels(doom(vizdoom_configs.get_config("dqn,cpu")))
    self.num_envs, self.num_actions, self.obs_shape = num_envs, view.actions, view.obs_shape
    self.env_id = "FakeDoom-v0"
    self.fail_at, self.how, self.t = fail_at, how, 0
    self._step = vec_env.Step
    self.rng = np.random.default_rng(0)

  def reset(self):  # rl.vizdoom's SPS probe resets and steps first: count from the second reset
    self.t, self.resets = 0, getattr(self, "resets", 0) + 1
    return self.rng.integers(0, 255, (self.num_envs, *self.obs_shape), np.uint8), {}

  def step(self, actions):
    self.t += 1
    if self.t == self.fail_at and self.resets >= 2:
      if self.how == "raise":
        raise RuntimeError("worker 1 died")
      time.sleep(30)
    n = self.num_envs
    no = np.zeros(n, bool)
    return self._step(
        self.rng.integers(0, 255, (n, *self.obs_shape), np.uint8),
        np.zeros(n, np.float32),
        no,
        no,
        ~no,
        {"terminated": no, "truncated": no},
    )

  def close(self):
    pass


def test_env_failure_checkpoints_and_stops_with_the_env_id(tmp_path, monkeypatch):
  """An env step that raises, or hangs past env_timeout_s, stops the run with one error naming
  the env, after a checkpoint; the rerun resumes from it."""
  config = doom_config(num_envs=2, buffer_size=200, learning_starts=10_000, batch_size=8, n_step=3)
  config.env_timeout_s = 2.0

  def run():
    return vizdoom.train(doom(config), str(tmp_path / "doom"), tensorboard=False, verbose=False)

  for fail_at, how, match in ((6, "raise", "worker 1 died"), (4, "hang", "no reply within 2 s")):
    monkeypatch.setattr(
        doom_env, "make_env", lambda *a, fail_at=fail_at, how=how, **k: _FakeDoom(2, fail_at, how)
    )
    with pytest.raises(
        watchdog.EnvFailure, match=rf"FakeDoom-v0: env.step\(\).*{match}.*" r"checkpoint saved"
    ):
      run()
  monkeypatch.setattr(doom_env, "make_env", lambda *a, **k: _FakeDoom(2))
  summary = run()
  assert summary["resumed_from"] == 10 + 3 * 2  # 5 steps of 2 envs, then 3 more
  assert summary["env_steps"] >= 40


def _games_in(folder: Path) -> list[int]:
  """Pids of live ViZDoom game processes whose working directory is under ``folder`` (games
  of a run live in OUT_DIR/vizdoom, so this finds them even after their parent died)."""
  out = []
  for name in os.listdir("/proc"):
    try:
      if (
          name.isdigit()
          and "vizdoom" in os.readlink(f"/proc/{name}/exe")
          and Path(os.readlink(f"/proc/{name}/cwd")).is_relative_to(folder)
      ):
        out.append(int(name))
    except OSError:
      continue
  return out


@pytest.mark.skipif(not _envpool_ready(), reason="envpool not available")
def test_binary_doom_dense_with_tensorboard_finishes(tmp_path):
  """The real binary on VizDoom, default 8 envs, TensorBoard on: it starts, finishes, writes
  summary.json and the events, and leaves no game behind. No learning (learning_starts is
  past the end): this checks the start-up and the env loop, cheaply."""
  out = tmp_path / "doom"
  cmd = [
      sys.executable,
      "-m",
      "rl.vizdoom",
      "--config.total_steps=320",
      f"--out_dir={out}",
      "--config.dqn.buffer_size=400",
      "--config.log_every=160",
      "--config.checkpoint_every=0",
      "--config.env_timeout_s=60",
      "--tensorboard",
  ]
  proc = subprocess.run(
      cmd,
      cwd=REPO,
      capture_output=True,
      text=True,
      timeout=120,
      env=dict(os.environ, JAX_PLATFORMS="cpu"),
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  summary = json.loads((out / "summary.json").read_text())
  assert summary["env_steps"] >= 320 and summary["env_sps"] > 0
  assert summary["config"]["dqn"]["num_envs"] == vizdoom_configs.get_config().dqn.num_envs
  # the profile named no setting: the run folder records the one that ran, not "auto"
  assert summary["config"]["setting"] == vizdoom_configs.default_setting()
  recorded = json.loads((out / "vizdoom.config.json").read_text())
  assert recorded["setting"] == vizdoom_configs.default_setting()
  assert any(p.stat().st_size > 0 for p in (out / "tb").glob("events.out.tfevents.*"))
  assert _games_in(out) == []


def test_env_start_that_hangs_is_one_env_failure_in_time(tmp_path, monkeypatch):
  """A VizDoom start that never returns stops the run within env_timeout_s with one error
  naming the env and the step it was at (starting it)."""
  pytest.importorskip("envpool")
  monkeypatch.setattr(doom_env, "make_env", lambda *a, **k: time.sleep(30))
  config = doom_config(num_envs=2, buffer_size=200)
  config.env_timeout_s = 2.0
  t = time.perf_counter()
  with pytest.raises(
      watchdog.EnvFailure,
      match=r"^MyWayHome-dense \(VizdoomCustom-v1, 2 envs\): "
      r"starting the env gave no reply within 2 s",
  ):
    vizdoom.train(doom(config), str(tmp_path / "doom"), verbose=False)
  assert time.perf_counter() - t < 15


@pytest.mark.slow  # ~25 s: 10 starts of 8 games
@pytest.mark.skipif(not _envpool_ready(), reason="envpool not available")
def test_doom_envs_start_and_close_ten_times(tmp_path):
  """The run's set-up (agent config, TensorBoard writer, checkpoint manager) with scipy's
  OpenBLAS pool up, the state that made the parallel game start deadlock: 10 starts in a row
  all come up and close, and no game is left."""
  a = np.ones((300, 300))
  config = doom(vizdoom_configs.get_config(f"csd,{vizdoom_configs.default_setting()}"))
  vizdoom.learner_config(config)
  for i in range(10):
    scipy.linalg.blas.dgemm(1.0, a, a)  # (re)starts the BLAS worker threads
    run = records.Run(
        config, tmp_path / f"run{i}", num_envs=8, label="start", tensorboard=True, verbose=False
    )
    env = doom_env.start_doom("dense", 8, i, timeout_s=120, work_dir=tmp_path / "vizdoom")
    obs, _ = env.reset()
    env.step(np.zeros(8, np.int64))
    pids = env.game_pids
    assert len(pids) == 8 and obs.shape == (8, *doom_env.DOOM_OBS_SHAPE)
    env.close()
    run.close()
    assert not set(pids) & game_guard.game_processes(), f"start {i}: games left after close"


@pytest.mark.slow  # ~15 s
@pytest.mark.skipif(not _envpool_ready(), reason="envpool not available")
def test_exploration_binary_on_doom_finishes(tmp_path):
  """benchmarks.exploration starts VizDoom envs the same way (one cell, 8 envs, TensorBoard)."""
  out = tmp_path / "grid"
  cmd = [
      sys.executable,
      "-m",
      "benchmarks.exploration",
      "--config=configs/exploration.py:vizdoom",
      "--config.agents=dqn",
      "--config.seeds=1",
      "--config.total_steps=320",
      "--config.max_episodes=0",
      f"--out_dir={out}",
      "--config.runs.dqn.dqn.buffer_size=400",
      "--config.log_every=160",
      "--config.env_timeout_s=60",
  ]
  proc = subprocess.run(
      cmd,
      cwd=REPO,
      capture_output=True,
      text=True,
      timeout=300,
      env=dict(os.environ, JAX_PLATFORMS="cpu"),
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert json.loads((out / "exploration.json").read_text())["env_sps"]["dqn"]["None"] > 0
  assert _games_in(out) == []


@pytest.mark.slow
def test_paper_setting_csd_sa_learner_updates(tmp_path):
  """The paper setting's csd_sa learner (IMPALA Q-net, C51, convolutional state-action CSD with
  augmented contexts) on random 42x42 gray frame stacks: observe and one update run and change
  the extrinsic, intrinsic and bonus params (batch and replay shrunk; 2–3 min on 2 CPU cores)."""
  config = vizdoom_configs.get_config("csd_sa,paper")
  config.dqn.batch_size, config.dqn.buffer_size, config.dqn.learning_starts = 8, 640, 0
  cfg = vizdoom.learner_config(doom(config))
  rng = np.random.default_rng(0)
  frames = lambda: jnp.asarray(rng.integers(0, 255, (cfg.num_envs, *cfg.obs_shape), np.uint8))
  obs = frames()
  state = dqn.init(cfg, jax.random.PRNGKey(0), obs)
  state, actions = dqn.first_actions(cfg, state, obs)
  observe = jax.jit(lambda s, *a: dqn.observe(cfg, s, *a))
  no = jnp.zeros(cfg.num_envs, bool)
  for _ in range(cfg.n_step + 2):
    nxt = frames()
    state, actions = observe(state, obs, actions, nxt, jnp.zeros(cfg.num_envs), no, no, ~no)
    obs = nxt
  learner, _, metrics = jax.jit(lambda l, b, k: dqn.update(cfg, l, b, k))(
      state.learner, state.replay, jax.random.PRNGKey(1)
  )
  for before, after in [
      (state.learner.params, learner.params),
      (state.learner.intrinsic.params, learner.intrinsic.params),
      (state.learner.bonus_state, learner.bonus_state),
  ]:
    assert any(
        not np.allclose(x, y) for x, y in zip(jax.tree.leaves(before), jax.tree.leaves(after))
    )
  assert all(np.isfinite(float(metrics[k])) for k in dqn.metric_names(cfg))
