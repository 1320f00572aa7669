"""VizDoom MyWayHome (3 variants) through envpool, with the ``rl.vec_env`` interface.

``DoomPixels`` is what the agent sees and how it acts; ``make_env`` starts a ``DoomVecEnv`` of
a variant's map files (``rl.doom_maps``), ``start_doom`` does so under a ``Watchdog``
(``rl.watchdog``) and a ``Guardian`` (``rl.game_guard``), so that a failing or hung env ends
the run with one line instead of hanging it.

Two envpool facts this module relies on (envpool 1.2.5, checked in tests/test_envs.py):

1. envpool's VizDoom reward is computed only from deltas of its fixed game variables (ARMOR,
   HEALTH, ...; the cfg's ``living_reward`` and the map's ACS ``reward`` are ignored), and picking
   up the armor runs ``Exit_Normal`` at once, so the engine has no state on that step and envpool
   returns reward 0 with the previous obs and info. The success reward is lost; since nothing else
   in MyWayHome terminates an episode (no monsters, no damage; the 2,100-frame limit is reported
   as truncation), success is ``terminated & ~truncated``. (A success on the last step would be
   reported as truncation: not distinguishable, probability negligible.)
2. envpool auto-resets on the call after ``done``: that step returns ``elapsed_step == 0``, the
   new first obs, reward 0, terminated = truncated = False. Hence ``valid = ~previous_done``.

ViZDoom writes ``_vizdoom/`` and ``_vizdoom.ini`` into the working directory of the process that
starts the game; ``make_envpool_from_files`` therefore starts the games inside ``work_dir``
(default: a folder in the map cache) by changing the working directory for the duration of
``envpool.make`` only, and pre-creates ``_vizdoom/`` (parallel game starts race on it). The games
start with the BLAS thread pools quiesced (``rl.game_guard.quiesce_blas_thread_pools``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from rl import doom_maps
from rl import game_guard
from rl import vec_env
from rl import watchdog

ENVPOOL_TASK = "VizdoomCustom-v1"
# MyWayHome's episode cap in game frames (tics): its cfg's episode_timeout.
EPISODE_FRAMES = 2100


# The buttons my_way_home.cfg declares, in its order (envpool's non-combined action is a
# float vector over them, passed to ViZDoom's setAction as is).
DOOM_BUTTONS = ("TURN_LEFT", "TURN_RIGHT", "MOVE_FORWARD", "MOVE_LEFT", "MOVE_RIGHT")
# The action sets: 5 = one button per step, the button's one-hot vector (the CSD authors'
# vizdoomgym wrapper); 18 = envpool's combined actions (MyWayHome-v1): turn none/right/left x
# move none/forward/right/forward+right/left/forward+left, index turn + 3 * move.
DOOM_ACTION_SETS = (5, 18)
# The combined-action index that presses only that button (measured with the probe; checked in
# tests/test_envs.py).
DOOM_COMBINED_BUTTONS = {
    "TURN_LEFT": 2,
    "TURN_RIGHT": 1,
    "MOVE_FORWARD": 3,
    "MOVE_LEFT": 12,
    "MOVE_RIGHT": 6,
}


def doom_action(button: str, num_actions: int) -> int:
  """The action of the ``num_actions`` set (5 or 18) that presses ``button`` alone."""
  if num_actions not in DOOM_ACTION_SETS or button not in DOOM_BUTTONS:
    raise ValueError(
        f"no action pressing {button!r} in a set of {num_actions}; buttons: "
        f"{', '.join(DOOM_BUTTONS)}, sets: {DOOM_ACTION_SETS}"
    )
  return DOOM_BUTTONS.index(button) if num_actions == 5 else DOOM_COMBINED_BUTTONS[button]


@dataclasses.dataclass(frozen=True)
class DoomPixels:
  """What the agent sees of MyWayHome and how it acts: the last ``stack`` frames, each
  resized by envpool (OpenCV INTER_AREA) to ``size`` x ``size``, RGB or ViZDoom's 8-bit gray
  (``gray``), one agent step per ``frame_skip`` game frames (the action repeated), and
  ``actions`` (``DOOM_ACTION_SETS``): 5 single buttons or 18 combinations, Discrete either
  way. Episodes end after ``EPISODE_FRAMES`` frames whatever the skip (envpool counts them as
  truncation)."""

  size: int = 84
  stack: int = 4
  gray: bool = False
  frame_skip: int = 4
  actions: int = 18

  def __post_init__(self):
    if min(self.size, self.stack, self.frame_skip) < 1:
      raise ValueError(f"size, stack and frame_skip must be >= 1, got {self}")
    if EPISODE_FRAMES % self.frame_skip:
      raise ValueError(
          f"frame_skip must divide the {EPISODE_FRAMES}-frame episode cap, "
          f"got {self.frame_skip}"
      )
    if self.actions not in DOOM_ACTION_SETS:
      raise ValueError(
          f"actions must be 5 (one button per step) or 18 (the combined "
          f"buttons), got {self.actions!r}"
      )

  @property
  def obs_shape(self) -> tuple[int, int, int]:
    """uint8 (channels, size, size): ``stack`` frames of 1 (gray) or 3 (RGB) channels."""
    return (self.stack * (1 if self.gray else 3), self.size, self.size)

  @property
  def max_episode_steps(self) -> int:
    return EPISODE_FRAMES // self.frame_skip

  def envpool_kwargs(self) -> dict:
    return dict(
        frame_skip=self.frame_skip,
        stack_num=self.stack,
        img_height=self.size,
        img_width=self.size,
        max_episode_steps=self.max_episode_steps,
        use_combined_action=self.actions == 18,
    )  # else a Box over the 5 buttons


# MyWayHome-v1's view and actions (4 stacked 84x84 RGB frames, skip 4, the 18 combined
# actions), and the CSD paper's (thesis App. B; the 5 buttons of the authors' wrapper).
NATURE_PIXELS = DoomPixels()
PAPER_PIXELS = DoomPixels(size=42, stack=6, gray=True, frame_skip=1, actions=5)
# MyWayHome-v1's settings, passed explicitly so they are visible and cannot drift.
DOOM_DEFAULTS = NATURE_PIXELS.envpool_kwargs()  # 525 steps of 4 frames, Discrete(18)
DOOM_NUM_ACTIONS = NATURE_PIXELS.actions
DOOM_OBS_SHAPE = NATURE_PIXELS.obs_shape
# Combined-action indices, measured with the probe (sparse spawn, facing east).
DOOM_NOOP, DOOM_FORWARD = 0, DOOM_COMBINED_BUTTONS["MOVE_FORWARD"]


def transition_flags(
    terminated: np.ndarray, truncated: np.ndarray, prev_done: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
  """MyWayHome step semantics from envpool's flags; all arrays bool (num_envs,).

  Returns (reward float32, done, success, valid): success = terminated & ~truncated (see the
  module docstring), reward = 1.0 on success, done = terminated | truncated,
  valid = ~prev_done (the step after a done is envpool's auto-reset step).
  """
  terminated, truncated, prev_done = (
      np.asarray(a, dtype=bool) for a in (terminated, truncated, prev_done)
  )
  success = terminated & ~truncated & ~prev_done
  return success.astype(np.float32), terminated | truncated, success, ~prev_done


# ----------------------------------------------------------------------------------------------
# Starting the games through envpool.


@contextlib.contextmanager
def _working_dir(path: Path) -> Iterator[None]:
  """Runs the body with ``path`` as the process working directory, then restores it.

  Not thread-safe (the working directory is process-wide): keep it to ``envpool.make``.
  """
  old = os.getcwd()
  os.chdir(path)
  try:
    yield
  finally:
    os.chdir(old)


# Game starts are serialised in a process: ``_working_dir`` changes the process-wide working
# directory, and the games a start created are told apart from the others by the pids it added.
_START_LOCK = threading.Lock()


def _start_games(
    files: doom_maps.MapFiles,
    num_envs: int,
    seed: int,
    work_dir: str | os.PathLike | None,
    envpool_kwargs: dict,
) -> tuple[Any, tuple[int, ...]]:
  """(raw envpool env, pids of the ViZDoom games it started); see ``make_envpool_from_files``."""
  import envpool  # VizDoom only (the [rl] extra); DeepSea runs without it

  if int(num_envs) < 1:
    raise ValueError(f"num_envs must be >= 1, got {num_envs}")
  if envpool_kwargs.get("batch_size", num_envs) != num_envs:
    raise ValueError(f"batch_size must equal num_envs ({num_envs}): async mode is not supported")
  for k in ("cfg_path", "wad_path", "env_type", "num_envs", "seed"):
    if k in envpool_kwargs:
      raise ValueError(f"{k} is set by make_envpool_from_files; do not pass it in envpool_kwargs")
  wd = Path(work_dir) if work_dir is not None else files.wad.parent / "workdir"
  (wd / "_vizdoom").mkdir(parents=True, exist_ok=True)
  with _START_LOCK:
    before = game_guard.game_processes()
    game_guard.quiesce_blas_thread_pools()
    with _working_dir(wd):
      env = envpool.make(
          ENVPOOL_TASK,
          env_type="gymnasium",
          cfg_path=str(files.cfg),
          wad_path=str(files.wad),
          num_envs=int(num_envs),
          seed=int(seed),
          **{**DOOM_DEFAULTS, **envpool_kwargs},
      )
    return env, tuple(sorted(game_guard.game_processes() - before))


def make_envpool_from_files(
    files: doom_maps.MapFiles,
    num_envs: int,
    seed: int,
    *,
    work_dir: str | os.PathLike | None = None,
    **envpool_kwargs: Any,
):
  """The raw envpool gymnasium env for a wad/cfg pair (``VizdoomCustom-v1``, MyWayHome settings).

  ``num_envs`` >= 1 games, env i seeded with ``seed + i`` (envpool's convention).
  ``work_dir``: where the games write ``_vizdoom*`` (default: ``<wad dir>/workdir``).
  ``envpool_kwargs`` override ``DOOM_DEFAULTS`` or add envpool config (e.g. ``num_threads``);
  ``batch_size`` other than ``num_envs`` (async mode) is refused. The games start with the
  BLAS pools quiesced (``rl.game_guard``). They end when the env is garbage-collected:
  envpool's ``close()`` does not stop them (``DoomVecEnv.close`` does).
  """
  return _start_games(files, num_envs, seed, work_dir, envpool_kwargs)[0]


def button_vectors(actions: np.ndarray, num_buttons: int) -> np.ndarray:
  """Single-button actions (ints in [0, num_buttons)) as envpool's non-combined action:
  float64 (len(actions), num_buttons), 1.0 on the pressed button, 0.0 elsewhere."""
  return np.eye(num_buttons, dtype=np.float64)[np.asarray(actions)]


class DoomVecEnv:
  """MyWayHome over envpool with extrinsic success reward and the auto-reset ``valid`` mask.

  ``env``: a raw envpool gymnasium env (``make_envpool``); ``env_id``: a name for messages;
  ``probe``: the map writes the player pose to USER2 (``rl.doom_maps``), decoded into
  ``info["pose"]`` = (x, y, angle_turns), each (num_envs,); stale on terminal steps.
  ``info`` also carries envpool's own keys (``elapsed_step``, game variables) and its reward
  as ``envpool_reward`` (always 0 in MyWayHome; kept for checks).
  Actions are Discrete either way: envpool's combined actions are passed on; over envpool's
  Box of buttons (``use_combined_action=False``), action i presses button i alone.
  ``game_pids``: the ViZDoom game processes of this env (``make_env`` fills them in), which
  ``kill`` ends when the env cannot be closed (a hung call).
  """

  def __init__(self, env, env_id: str, probe: bool = False, game_pids: tuple[int, ...] = ()):
    self.env = env
    self.env_id = env_id
    self.probe = probe
    self.game_pids = tuple(game_pids)
    self.guardian: game_guard.Guardian | None = None  # set by start_doom
    self.num_envs = int(env.config["num_envs"])
    space = env.action_space
    self.buttons = not hasattr(space, "n")  # a Box over the buttons: one-hot actions
    self.num_actions = int(space.shape[-1] if self.buttons else space.n)
    self.obs_shape = tuple(env.observation_space.shape)
    self._prev_done = None

  def _info(
      self, info: dict, terminated: np.ndarray, truncated: np.ndarray, envpool_reward: np.ndarray
  ) -> dict:
    out = dict(info, terminated=terminated, truncated=truncated, envpool_reward=envpool_reward)
    if self.probe:
      out["pose"] = doom_maps.decode_probe(info["USER2"])
    return out

  def reset(self) -> tuple[np.ndarray, dict]:
    """Resets all envs. Returns obs uint8 (num_envs, *obs_shape) and info."""
    obs, info = self.env.reset()
    self._prev_done = np.zeros(self.num_envs, dtype=bool)
    zeros = np.zeros(self.num_envs, dtype=bool)
    return obs, self._info(info, zeros, zeros, np.zeros(self.num_envs, np.float32))

  def step(self, actions) -> vec_env.Step:
    """Steps all envs. ``actions``: ints in [0, num_actions), shape (num_envs,)."""
    if self._prev_done is None:
      raise RuntimeError(f"{self.env_id}: call reset() before step()")
    a = vec_env.check_actions(self.env_id, actions, self.num_envs, self.num_actions)
    a = button_vectors(a, self.num_actions) if self.buttons else a.astype(np.int32)
    obs, raw_reward, terminated, truncated, info = self.env.step(a)
    reward, done, success, valid = transition_flags(terminated, truncated, self._prev_done)
    self._prev_done = done
    return vec_env.Step(
        obs, reward, done, success, valid, self._info(info, terminated, truncated, raw_reward)
    )

  def close(self) -> None:
    """Ends the games: envpool's ``close()`` leaves them running, its destructor stops them,
    so the env is dropped here; any game still up after that is killed."""
    if self.env is not None:
      self.env.close()
      self.env = None  # the last reference: envpool's destructor closes every game
    self.kill()
    if self.guardian is not None:
      self.guardian.close()

  def kill(self) -> list[int]:
    """SIGKILLs this env's games that are still running; returns their pids."""
    return game_guard.kill_games(self.game_pids)


def doom_env_id(variant: str, num_envs: int) -> str:
  """The name messages use for a MyWayHome env."""
  return f"MyWayHome-{variant} ({ENVPOOL_TASK}, {num_envs} envs)"


def make_env(
    variant: str,
    num_envs: int,
    seed: int,
    *,
    cache_dir: str | os.PathLike | None = None,
    work_dir: str | os.PathLike | None = None,
    probe: bool = False,
    pixels: DoomPixels = NATURE_PIXELS,
    **envpool_kwargs: Any,
) -> DoomVecEnv:
  """``DoomVecEnv`` for MyWayHome ``variant``; obs uint8 (num_envs, *pixels.obs_shape),
  ``pixels.actions`` actions."""
  files = doom_maps.variant_files(variant, cache_dir, probe=probe, gray=pixels.gray)
  env, pids = _start_games(
      files, num_envs, seed, work_dir, {**pixels.envpool_kwargs(), **envpool_kwargs}
  )
  return DoomVecEnv(env, doom_env_id(variant, num_envs), probe=probe, game_pids=pids)


def start_doom(
    variant: str, num_envs: int, seed: int, *, timeout_s: float, **make_env_kwargs: Any
) -> watchdog.Watchdog:
  """``make_env`` under a ``Watchdog``: starting the games, and then every reset / step /
  close, must finish within ``timeout_s``.

  A start that does not becomes one ``EnvFailure`` naming the env, the time and how many of
  the games had come up; those games are killed first. A start that fails, or is interrupted
  (Ctrl-C), kills the games started so far too, then raises. A start that hangs holding the
  GIL (inside envpool) is ended by the env's ``Guardian`` a few seconds later instead: one
  line on stderr, games killed, process SIGKILLed. The guardian also kills the games if this
  process dies without closing the env.
  """
  env_id = doom_env_id(variant, num_envs)
  before = game_guard.game_processes()
  label = getattr(getattr(sys.modules.get("__main__"), "__spec__", None), "name", None)
  guardian = game_guard.Guardian(
      timeout_s + 5.0, before, f"{label + ': ' if label else ''}{env_id}: starting the env"
  )

  def build() -> DoomVecEnv:
    env = make_env(variant, num_envs, seed, **make_env_kwargs)
    guardian.started(getattr(env, "game_pids", ()))
    if isinstance(env, DoomVecEnv):
      env.guardian = guardian
    else:  # a stand-in without games (tests) has nothing to guard
      guardian.close()
    return env

  def kill_started() -> str:
    killed = game_guard.kill_games(game_guard.game_processes() - before)
    guardian.close()
    return f"{len(killed)} of {num_envs} ViZDoom games had come up (killed)"

  return watchdog.Watchdog.start(build, env_id, timeout_s, cleanup=kill_started)


def measure_steps_per_second(env, num_steps: int, seed: int = 0) -> float:
  """Vectorised env steps per second (num_steps * num_envs / wall time), uniform random actions.

  ``env``: a raw envpool env, ``DoomVecEnv`` or ``DeepSeaVecEnv``; it is reset first.
  """
  if num_steps < 1:
    raise ValueError(f"num_steps must be >= 1, got {num_steps}")
  n = int(env.config["num_envs"]) if hasattr(env, "config") else env.num_envs
  space = getattr(env, "action_space", None)  # a raw envpool env's: Discrete, or a Box of buttons
  buttons = space is not None and not hasattr(space, "n")
  k = env.num_actions if space is None else int(space.shape[-1] if buttons else space.n)
  rng = np.random.default_rng(seed)
  actions = rng.integers(0, k, size=(num_steps, n))
  if buttons:
    actions = button_vectors(actions, k)
  env.reset()
  t0 = time.perf_counter()
  for t in range(num_steps):
    env.step(actions[t])
  return num_steps * n / (time.perf_counter() - t0)
