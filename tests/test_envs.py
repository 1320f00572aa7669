"""The env layer: success detection and auto-reset masking on real envpool trajectories
(rl.doom_env), DeepSea semantics (rl.deepsea_env), the watchdog and the game-process guard."""

import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from rl import agents
from rl import doom_maps as dm
from rl import deepsea_env
from rl import doom_env
from rl import game_guard
from rl import watchdog

# ---------------------------------------------------------------------------------------------
# MyWayHome through envpool. A test map spawns the player at map spot 26 (x 1039, y -170),
# facing south (0.75 turns), ~180 units north of the armor: walking forward reaches it in ~7
# steps, so a real success event is recorded in a second.

NEAR_GOAL = dm.Spawn(tid=26, angle_turns=(0.75, 0.75))
STEPS = 528  # env 1 idles: truncated at step 525, auto-reset at 526


@pytest.fixture(scope="module")
def trajectory(tmp_path_factory):
  """Recorded run of 2 envs: env 0 always walks forward, env 1 does nothing."""
  pytest.importorskip("envpool")
  files = dm.spawn_files(NEAR_GOAL, tmp_path_factory.mktemp("vizdoom_maps"), probe=True)
  env = doom_env.DoomVecEnv(
      doom_env.make_envpool_from_files(files, 2, seed=0), "near-goal test map", probe=True
  )
  try:
    obs0, info0 = env.reset()
    steps = [env.step(np.array([doom_env.DOOM_FORWARD, doom_env.DOOM_NOOP])) for _ in range(STEPS)]
    with pytest.raises(ValueError, match="near-goal test map"):
      env.step(np.array([18, 0]))
    with pytest.raises(ValueError, match="near-goal test map"):
      env.step(np.array([0, 0, 0]))
  finally:
    env.close()
  stack = lambda f: np.stack([f(s) for s in steps])  # noqa: E731
  return dict(
      obs0=obs0,
      pose0=np.stack(info0["pose"]),
      obs=stack(lambda s: s.obs),
      reward=stack(lambda s: s.reward),
      done=stack(lambda s: s.done),
      success=stack(lambda s: s.success),
      valid=stack(lambda s: s.valid),
      terminated=stack(lambda s: s.info["terminated"]),
      truncated=stack(lambda s: s.info["truncated"]),
      raw_reward=stack(lambda s: s.info["envpool_reward"]),
      elapsed=stack(lambda s: s.info["elapsed_step"]),
      pose=stack(lambda s: np.stack(s.info["pose"])),  # (T, 3, num_envs)
  )


def test_doom_shapes_and_dtypes(trajectory):
  assert (
      trajectory["obs0"].shape == (2, *doom_env.DOOM_OBS_SHAPE)
      and trajectory["obs0"].dtype == np.uint8
  )
  assert (
      trajectory["obs"].shape == (STEPS, 2, *doom_env.DOOM_OBS_SHAPE)
      and trajectory["obs"].dtype == np.uint8
  )
  assert trajectory["reward"].dtype == np.float32
  for k in ("done", "success", "valid"):
    assert trajectory[k].dtype == bool and trajectory[k].shape == (STEPS, 2)


def test_envpool_loses_the_success_reward(trajectory):
  t = trajectory
  ends = np.flatnonzero(t["terminated"][:, 0])
  assert len(ends) >= 30  # ~8 steps per episode
  first = ends[0]
  assert 3 <= first <= 15
  assert not t["truncated"][first, 0]
  np.testing.assert_array_equal(
      t["raw_reward"], 0.0
  )  # envpool's reward is 0 everywhere, success included
  # The engine has no state on the exit step: envpool repeats the previous obs.
  np.testing.assert_array_equal(t["obs"][first, 0], t["obs"][first - 1, 0])
  # The last pose before the exit is next to the armor.
  x, y = t["pose"][first - 1, 0, 0], t["pose"][first - 1, 1, 0]
  assert np.hypot(x - dm.GOAL_XY[0], y - dm.GOAL_XY[1]) < 64


def test_success_detection(trajectory):
  t = trajectory
  np.testing.assert_array_equal(t["success"][:, 0], t["terminated"][:, 0])
  np.testing.assert_array_equal(t["reward"], t["success"].astype(np.float32))
  assert not t["success"][:, 1].any()  # env 1 never moves: only a truncation
  trunc = np.flatnonzero(t["truncated"][:, 1])
  assert list(trunc) == [524] and t["elapsed"][524, 1] == 525 and not t["terminated"][524, 1]
  assert t["done"][524, 1] and not t["done"][:524, 1].any()


def test_auto_reset_step_is_masked(trajectory):
  t = trajectory
  after = np.flatnonzero(t["done"][:-1, 0]) + 1
  np.testing.assert_array_equal(np.flatnonzero(~t["valid"][:, 0]), after)
  np.testing.assert_array_equal(~t["valid"][:, 1], np.arange(STEPS) == 525)
  for i in after:  # envpool's reset step: a new first obs, not a transition
    assert t["elapsed"][i, 0] == 0 and not t["done"][i, 0] and t["reward"][i, 0] == 0
    np.testing.assert_array_equal(t["pose"][i, :, 0], t["pose0"][:, 0])
    frames = t["obs"][i, 0].reshape(4, 3, 84, 84)  # envpool fills the stack with the first frame
    assert all(np.array_equal(frames[0], f) for f in frames[1:])
    assert np.abs(t["obs"][i, 0].astype(int) - t["obs0"][0]).mean() < 1.0  # ~ the reset() obs
    assert (
        np.abs(t["obs"][i, 0].astype(int) - t["obs"][i - 1, 0]).mean() > 5.0
    )  # a jump, not a move
  assert t["elapsed"][525, 1] == 0
  # valid <=> envpool's elapsed_step > 0 (an independent view of the same fact)
  np.testing.assert_array_equal(t["valid"], t["elapsed"] > 0)


def test_transition_flags_on_recorded_flags(trajectory):
  t = trajectory
  prev = np.concatenate([np.zeros((1, 2), bool), t["done"][:-1]])
  r, d, s, v = doom_env.transition_flags(t["terminated"], t["truncated"], prev)
  np.testing.assert_array_equal(r, t["reward"])
  np.testing.assert_array_equal(d, t["done"])
  np.testing.assert_array_equal(s, t["success"])
  np.testing.assert_array_equal(v, t["valid"])


def test_transition_flags_truth_table():
  term = np.array([True, False, True, False, True])
  trunc = np.array([False, True, True, False, False])
  prev = np.array([False, False, False, False, True])
  r, d, s, v = doom_env.transition_flags(term, trunc, prev)
  np.testing.assert_array_equal(s, [True, False, False, False, False])
  np.testing.assert_array_equal(r, [1, 0, 0, 0, 0])
  np.testing.assert_array_equal(d, [True, True, True, False, True])
  np.testing.assert_array_equal(v, [True, True, True, True, False])


@pytest.mark.parametrize("variant", agents.VARIANTS)
def test_envpool_config_is_mywayhome_v1(variant, tmp_path):
  envpool = pytest.importorskip("envpool")
  files = dm.variant_files(variant, tmp_path)
  ours = envpool.make_spec(
      doom_env.ENVPOOL_TASK,
      cfg_path=str(files.cfg),
      wad_path=str(files.wad),
      **doom_env.DOOM_DEFAULTS,
  )
  ref = envpool.make_spec("MyWayHome-v1", use_combined_action=True)
  a, b = ours.config._asdict(), ref.config._asdict()
  assert {k for k in a if a[k] != b[k]} == {"cfg_path", "wad_path"}
  assert ours.action_space.n == doom_env.DOOM_NUM_ACTIONS
  assert (
      ours.observation_space.shape == doom_env.DOOM_OBS_SHAPE
      and ours.observation_space.dtype == np.uint8
  )


def test_make_env_rejects_bad_arguments(tmp_path):
  with pytest.raises(ValueError, match="variant"):
    doom_env.make_env("medium", 1, 0, cache_dir=tmp_path)
  files = dm.variant_files("sparse", tmp_path)
  with pytest.raises(ValueError, match="num_envs"):
    doom_env.make_envpool_from_files(files, 0, 0)
  with pytest.raises(ValueError, match="batch_size"):
    doom_env.make_envpool_from_files(files, 4, 0, batch_size=2)


# ---------------------------------------------------------------------------------------------
# The action sets: 5 single buttons (the CSD authors' wrapper, one-hot over envpool's Box of
# buttons) or envpool's 18 combinations. From the Sparse spawn (facing east, an open room),
# env i of 5 holds button i for BUTTON_STEPS steps of 4 frames; the probe map reports the pose.

BUTTON_STEPS = 2


@pytest.fixture(scope="module")
def button_runs(tmp_path_factory):
  """{5: ..., 18: ...}: obs (BUTTON_STEPS+1, 5, 12, 84, 84) and pose (BUTTON_STEPS+1, 3, 5)
  (x, y, angle_turns) of the 5 envs pressing one button each, and the env's num_actions."""
  pytest.importorskip("envpool")
  cache = tmp_path_factory.mktemp("vizdoom_maps")
  runs = {}
  for n in doom_env.DOOM_ACTION_SETS:
    env = doom_env.make_env(
        "sparse",
        5,
        0,
        cache_dir=cache,
        work_dir=cache / "work",
        probe=True,
        pixels=doom_env.DoomPixels(actions=n),
    )
    try:
      press = np.array([doom_env.doom_action(b, n) for b in doom_env.DOOM_BUTTONS])
      obs, info = env.reset()
      obs, pose = [obs], [np.stack(info["pose"])]
      for _ in range(BUTTON_STEPS):
        step = env.step(press)
        obs.append(step.obs)
        pose.append(np.stack(step.info["pose"]))
      with pytest.raises(ValueError, match=rf"actions must be in \[0, {n}\)"):
        env.step(np.full(5, n))
      sps = doom_env.measure_steps_per_second(env.env, 2)  # the raw env: Discrete or a Box
    finally:
      env.close()
    runs[n] = dict(obs=np.stack(obs), pose=np.stack(pose), num_actions=env.num_actions, sps=sps)
  return runs


def test_the_five_buttons_are_my_way_home_cfgs():
  cfg = dm.stock_map_paths()[1].read_text()
  declared = cfg.split("available_buttons", 1)[1].split("{", 1)[1].split("}", 1)[0].split()
  assert tuple(declared) == doom_env.DOOM_BUTTONS


def _moves(pose):
  """(forward, left, turn) of each env from its first pose to its last: map units along and
  to the left of the first heading, and turns counter-clockwise (left) in (-0.5, 0.5]."""
  (x0, y0, a0), (x1, y1, a1) = pose[0], pose[-1]
  theta, dx, dy = 2 * np.pi * a0, x1 - x0, y1 - y0
  turn = -((a0 - a1 + 0.5) % 1.0 - 0.5)
  return dx * np.cos(theta) + dy * np.sin(theta), -dx * np.sin(theta) + dy * np.cos(theta), turn


def _shift(before, after, most=30):
  """The horizontal shift (pixels, > 0: to the right) that best maps ``before`` onto ``after``
  (mean absolute difference over the overlap); both (channels, height, width)."""
  a, b = before.astype(float).mean(0), after.astype(float).mean(0)
  err = {
      s: np.abs(b[:, s:] - a[:, : a.shape[1] - s]).mean()
      if s >= 0
      else np.abs(b[:, :s] - a[:, -s:]).mean()
      for s in range(-most, most + 1)
  }
  return min(err, key=err.get)


def _zoom_gain(before, after, zoom=1.1):
  """How much better ``before`` magnified ``zoom`` times about its centre matches ``after``
  than ``before`` itself does (ratio of mean absolute differences, < 1: better)."""
  a, b = before.astype(float).mean(0), after.astype(float).mean(0)
  n = a.shape[0]
  idx = np.clip(np.round((np.arange(n) + 0.5 - n / 2) / zoom + n / 2 - 0.5).astype(int), 0, n - 1)
  return np.abs(b - a[np.ix_(idx, idx)]).mean() / np.abs(b - a).mean()


def test_each_of_the_five_actions_does_what_its_name_says(button_runs):
  run = button_runs[5]
  assert run["num_actions"] == 5 and run["sps"] > 0
  forward, left, turn = _moves(run["pose"])
  still, straight = 2.0, 1.5 / 512  # units (positions are truncated), turns (probe resolution)
  expect = {
      "TURN_LEFT": (0, 0, 1),
      "TURN_RIGHT": (0, 0, -1),
      "MOVE_FORWARD": (1, 0, 0),
      "MOVE_LEFT": (0, 1, 0),
      "MOVE_RIGHT": (0, -1, 0),
  }
  for i, name in enumerate(doom_env.DOOM_BUTTONS):
    f, l, t = expect[name]
    got = f"{name}: forward {forward[i]:g}, left {left[i]:g}, turn {turn[i]:.4f}"
    assert (forward[i] > 15) if f else abs(forward[i]) <= still, got
    assert (l * left[i] > 15) if l else abs(left[i]) <= still, got
    assert (t * turn[i] > 0.03) if t else abs(turn[i]) <= straight, got
  # The frames agree: what is left of the view moves right in the image when the player turns
  # or steps left, and the other way for right; walking forward magnifies the view.
  newest = lambda t, i: run["obs"][t, i, -3:]  # noqa: E731  (the newest RGB frame)
  for i, name in enumerate(doom_env.DOOM_BUTTONS):
    s = _shift(newest(0, i), newest(-1, i))
    if name == "MOVE_FORWARD":
      assert abs(s) <= 1, (name, s)
    else:
      assert (s >= 3) if name.endswith("LEFT") else (s <= -3), (name, s)
  gains = [_zoom_gain(newest(0, i), newest(1, i)) for i in range(5)]
  assert gains[2] < 0.8 and gains[2] == min(gains), gains


def test_the_combined_set_holds_the_five_buttons(button_runs):
  """The 18 combined actions named in ``DOOM_COMBINED_BUTTONS`` press one button: the same
  frames and poses as the one-hot actions (same seeds, so the same spawns)."""
  assert button_runs[18]["num_actions"] == 18 and button_runs[18]["sps"] > 0
  np.testing.assert_array_equal(button_runs[18]["pose"], button_runs[5]["pose"])
  np.testing.assert_array_equal(button_runs[18]["obs"], button_runs[5]["obs"])
  assert (
      doom_env.DOOM_FORWARD == doom_env.doom_action("MOVE_FORWARD", 18) and doom_env.DOOM_NOOP == 0
  )


def test_the_action_set_option_is_checked_and_is_part_of_a_runs_identity(tmp_path):
  from configs import vizdoom as vizdoom_configs
  from rl import records, run_config, vizdoom
  from cmdline import cli

  def doom(profile_or_config):
    config = profile_or_config
    if isinstance(config, str):
      config = vizdoom_configs.get_config(config)
    return run_config.from_config(run_config.VizDoom, config)

  with pytest.raises(ValueError, match="actions must be 5 .* or 18 .*, got 6"):
    doom_env.DoomPixels(actions=6)
  assert doom_env.DoomPixels(actions=5).envpool_kwargs()["use_combined_action"] is False
  assert doom_env.DOOM_DEFAULTS["use_combined_action"] is True
  with pytest.raises(ValueError, match="no action pressing 'JUMP'"):
    doom_env.doom_action("JUMP", 5)
  for setting, n in (("paper", 5), ("cpu", 5), ("nature", 18)):
    config = doom(f"csd_sa,{setting}")
    assert config.pixels.actions == n and vizdoom.pixels(config).actions == n
    assert vizdoom.learner_config(config).num_actions == n
  config = vizdoom_configs.get_config("dqn,cpu")
  config.pixels.actions = 7
  with pytest.raises(
      cli.ConfigError, match=r"^--config.pixels.actions must be one of 5, 18; got 7$"
  ):
    doom(config)
  # A run recorded before the field had the 18 combined actions: it resumes as such only.
  config.pixels.actions = 5
  now = run_config.identity(doom(config))
  assert now["pixels"]["actions"] == 5
  old = {**now, "pixels": {k: v for k, v in now["pixels"].items() if k != "actions"}}
  assert not run_config.same_config(old, now)
  assert run_config.config_differences(old, now) == ["pixels.actions saved 18, now 5"]
  assert run_config.same_config(old, {**now, "pixels": {**now["pixels"], "actions": 18}})
  # Resuming a run of the other set stops with one line, before its Q-head's shapes clash.
  run = records.Run(
      doom("dqn,nature"),
      tmp_path,
      num_envs=1,
      label="18",
      tensorboard=False,
      verbose=False,
  )
  run.start(0)
  run.save({"head": np.zeros(18, np.float32)}, 8)
  run = records.Run(
      doom("dqn,cpu"),
      tmp_path,
      num_envs=1,
      label="5",
      tensorboard=False,
      verbose=False,
  )
  with pytest.raises(
      cli.ConfigError,
      match=r"different config \(.*pixels.actions saved 18, "
      r"now 5.*\): use another --out_dir[^\n]*$",
  ):
    run.restore({"head": np.zeros(5, np.float32)})


# ---------------------------------------------------------------------------------------------
# DeepSea.

N = 10


@pytest.fixture(scope="module")
def sea():
  pytest.importorskip("gymnax")
  return deepsea_env.DeepSeaVecEnv(N, num_envs=3, seed=0, mapping_seed=0)


def _run(env, policy, steps):
  """policy(row, column, mapping) -> actions (num_envs,); returns the list of Steps."""
  obs, info = env.reset()
  m, out = env.action_mapping, []
  row, col = info["row"], info["column"]
  for _ in range(steps):
    s = env.step(policy(row, col, m))
    out.append(s)
    row, col = s.info["row"], s.info["column"]
  return obs, out


def test_deep_sea_action_mapping_is_random_per_cell(sea):
  sea.reset()
  m = sea.action_mapping
  assert m.shape == (N, N) and set(np.unique(m)) == {0, 1}
  # Neither constant action is "right" along the whole diagonal.
  assert not np.all(m[np.arange(N), np.arange(N)] == 1) and not np.all(
      m[np.arange(N), np.arange(N)] == 0
  )


def test_deep_sea_optimal_policy_finds_the_treasure(sea):
  oracle = lambda r, c, m: np.full(3, m[np.minimum(r[0], N - 1), c[0]])  # noqa: E731
  obs, steps = _run(sea, oracle, N + 2)
  assert obs.shape == (3, N * N) and obs.dtype == np.float32
  np.testing.assert_array_equal(obs[:, 0], 1.0)
  np.testing.assert_array_equal(obs.sum(1), 1.0)
  rew = np.stack([s.reward for s in steps])[:, 0]
  assert rew.dtype == np.float32
  np.testing.assert_allclose(rew[: N - 1], -0.01 / N, rtol=1e-6)
  np.testing.assert_allclose(rew[N - 1], 1 - 0.01 / N, rtol=1e-6)
  np.testing.assert_allclose(rew[:N].sum(), 0.99, rtol=1e-5)
  done = np.stack([s.done for s in steps])[:, 0]
  succ = np.stack([s.success for s in steps])[:, 0]
  valid = np.stack([s.valid for s in steps])[:, 0]
  np.testing.assert_array_equal(done, np.arange(N + 2) == N - 1)  # episode length N
  np.testing.assert_array_equal(succ, np.arange(N + 2) == N - 1)
  np.testing.assert_array_equal(valid, np.arange(N + 2) != N)  # auto-reset step masked
  np.testing.assert_array_equal(steps[N - 1].obs[0], 0.0)  # terminal obs: off the grid
  assert steps[N - 1].info["terminated"][0] and not steps[N - 1].info["truncated"][0]
  np.testing.assert_array_equal(steps[N].obs[0], obs[0])  # reset step returns the first obs
  assert steps[N].reward[0] == 0 and not steps[N].done[0]


@pytest.mark.parametrize("action", [0, 1])
def test_deep_sea_constant_actions_fail(sea, action):
  _, steps = _run(sea, lambda r, c, m: np.full(3, action), N)
  assert not np.any([s.success for s in steps])
  assert steps[-1].done.all()
  total = np.sum([s.reward for s in steps], axis=0)
  assert np.all(total <= 0) and np.all(total >= -0.01 - 1e-6)


def test_deep_sea_matches_bsuite(sea):
  deep_sea = pytest.importorskip("bsuite.environments.deep_sea")
  sea.reset()
  ref = deep_sea.DeepSea(size=N, deterministic=True, seed=0)
  ref._action_mapping = sea.action_mapping.astype(ref._action_mapping.dtype)
  rng = np.random.default_rng(1)
  ts = ref.reset()
  obs, _ = sea.reset()
  np.testing.assert_array_equal(obs[0], ts.observation.reshape(-1))
  for t in range(3 * (N + 1)):
    a = int(rng.integers(0, 2))
    s = sea.step(np.full(3, a))
    if not s.valid[0]:
      ts = ref.reset()
    else:
      ts = ref.step(a)
      assert s.reward[0] == pytest.approx(ts.reward, abs=1e-6)
      assert s.done[0] == ts.last()
    np.testing.assert_array_equal(s.obs[0], ts.observation.reshape(-1), err_msg=f"step {t}")


def test_deep_sea_observations_are_one_hot_or_zero(sea):
  """The promise behind the DeepSea nets' gathering first layer (``rl.deepsea.learner_config``,
  ``models.MLPSpec.one_hot_blocks``): every observation, terminal ones included, is one-hot
  or all zero."""
  rng = np.random.default_rng(2)
  obs, steps = _run(sea, lambda r, c, m: rng.integers(0, 2, 3), 4 * (N + 1))
  seen = np.concatenate([obs] + [s.obs for s in steps])
  assert set(np.unique(seen)) == {0.0, 1.0}
  assert set(seen.sum(1)) == {0.0, 1.0}


def test_deep_sea_errors_name_the_env(sea):
  sea.reset()
  with pytest.raises(ValueError, match="DeepSea-10"):
    sea.step(np.array([0, 2, 0]))
  with pytest.raises(ValueError, match="DeepSea-10"):
    sea.step(np.array([0, 1]))


def test_measure_steps_per_second_runs(sea):
  assert doom_env.measure_steps_per_second(sea, 3) > 0


# ---------------------------------------------------------------------------------------------
# Watchdog: env failures become one EnvFailure naming the env, never a hang.


class _Flaky:
  env_id = "Flaky-v0"
  num_envs = 3

  def __init__(self, how):
    self.how = how

  def step(self, actions):
    if self.how == "raise":
      raise OSError("pipe closed")
    if self.how == "hang":
      time.sleep(20)
    return np.asarray(actions) + 1

  def close(self):
    pass


def test_watchdog_passes_results_and_attributes_through():
  env = watchdog.Watchdog(_Flaky("ok"), timeout_s=5)
  np.testing.assert_array_equal(env.step(np.arange(3)), [1, 2, 3])
  assert env.num_envs == 3
  env.close()


@pytest.mark.parametrize(
    "how, message",
    [("raise", "failed: OSError: pipe closed"), ("hang", "gave no reply within 0.5 s")],
)
def test_watchdog_turns_errors_and_hangs_into_env_failure(how, message):
  env = watchdog.Watchdog(_Flaky(how), timeout_s=0.5)
  t = time.perf_counter()
  with pytest.raises(watchdog.EnvFailure, match=rf"^Flaky-v0: env.step\(\) {message}"):
    env.step(np.arange(3))
  assert time.perf_counter() - t < 5
  if how == "hang":
    with pytest.raises(watchdog.EnvFailure, match="hung"):
      env.step(np.arange(3))


def test_watchdog_start_turns_a_hanging_constructor_into_env_failure():
  cleaned = []

  def hang():
    time.sleep(20)

  t = time.perf_counter()
  with pytest.raises(
      watchdog.EnvFailure,
      match=r"^Hang-v0: starting the env gave no reply within "
      r"0\.5 s \(hung worker\?\); 2 games killed$",
  ):
    watchdog.Watchdog.start(
        hang, "Hang-v0", 0.5, cleanup=lambda: cleaned.append(1) or "2 games killed"
    )
  assert time.perf_counter() - t < 5 and cleaned == [1]
  with pytest.raises(
      watchdog.EnvFailure, match=r"^Boom-v0: starting the env failed: OSError: no wad$"
  ):
    watchdog.Watchdog.start(lambda: (_ for _ in ()).throw(OSError("no wad")), "Boom-v0", 5)
  dog = watchdog.Watchdog.start(lambda: _Flaky("ok"), "ignored", 5)
  assert dog.env_id == "Flaky-v0"  # the built env's own name
  np.testing.assert_array_equal(dog.step(np.arange(3)), [1, 2, 3])
  dog.close()


def test_guardian_ends_a_start_that_holds_the_gil(tmp_path):
  """envpool builds its games with the GIL held: no Python thread can time that out. The
  guardian process does: one line, then the process is SIGKILLed."""
  pytest.importorskip("envpool")
  code = (
      "import ctypes; from rl import game_guard; "
      "g = game_guard.Guardian(1.0, set(), 'Stuck-v0: starting the env'); "
      "ctypes.PyDLL(None).sleep(30)"
  )  # PyDLL keeps the GIL during the call
  t = time.perf_counter()
  proc = subprocess.run(
      [sys.executable, "-c", code],
      capture_output=True,
      text=True,
      timeout=25,
      cwd=Path(game_guard.__file__).parents[1],
  )
  assert time.perf_counter() - t < 15
  assert proc.returncode == -9, proc.stderr[-2000:]
  assert proc.stderr.strip().splitlines()[-1] == (
      "Stuck-v0: starting the env gave no reply within 1 s (the start holds the GIL); "
      "0 game(s) had come up (killed); process stopped"
  )


def test_quiesce_blas_thread_pools_stops_openblas_and_blas_still_works():
  a = np.ones((200, 200))
  a @ a  # the pool is up
  stopped = game_guard.quiesce_blas_thread_pools()
  assert any("openblas" in p for p in stopped), stopped
  np.testing.assert_allclose(a @ a, 200.0)  # OpenBLAS restarts its pool on the next call
