"""Environment layer for the DQN loop: envpool VizDoom MyWayHome (3 variants) and a JAX DeepSea.

Both expose one interface, vectorised over ``num_envs``::

    obs, info = env.reset()
    step = env.step(actions)   # Step(obs, reward, done, success, valid, info), numpy arrays

* ``reward``: the *extrinsic* reward, float32 (num_envs,). MyWayHome: 1.0 on success, else 0
  (Pathak et al. 2017). DeepSea: bsuite's reward (1 at the treasure, -0.01/N per right move).
* ``done``: bool (num_envs,), the episode ended at this step (terminated or truncated);
  ``info["terminated"]`` / ``info["truncated"]`` tell which (bootstrap through truncation).
* ``success``: bool (num_envs,), reached the goal (armor / treasure) at this step.
* ``valid``: bool (num_envs,), False on the step that follows a ``done``. Both environments
  auto-reset *on the next call* after ``done`` (envpool's semantics; DeepSea is made to match):
  that call ignores its action and returns the new episode's first obs with reward 0, so the
  pair (terminal obs -> first obs) is not a transition of the MDP. Replay and intrinsic-reward
  training data must drop rows with ``valid == False``.

Two envpool facts (envpool 1.2.5, measured on these machines and checked in tests/test_envs.py):

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
starts the game; ``make_envpool_from_files`` therefore starts the games inside ``work_dir`` (default: a
folder in the map cache) by changing the working directory for the duration of
``envpool.make`` only, and pre-creates ``_vizdoom/`` (parallel game starts race on it).

Starting the games safely: envpool starts its ViZDoom games from several threads at once, each
with ``fork()``, so every fork handler in the process runs concurrently with itself. OpenBLAS's
(``blas_thread_shutdown_``, joins the BLAS worker threads) is not safe for that in builds without
its lock, e.g. the OpenBLAS 0.3.30 bundled with scipy 1.17 (OpenMathLib/OpenBLAS#3111 fixed this
once; #5479 removed the lock again, #5569 restored it): two forks join the same worker and the
second waits forever on a recycled thread handle, so one game never starts and ``envpool.make``
never returns. ``quiesce_blas_thread_pools`` stops those pools before the games start.
Construction, reset and step can run under a ``Watchdog`` (``start_doom``), and the games'
processes are tracked so that a hung env's games can be killed (``DoomVecEnv.kill``).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from rl import doom_maps

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


class Step(NamedTuple):
  """One vectorised step; every field has leading dim num_envs.

  obs: (num_envs, *obs_shape) (uint8 for Doom, float32 for DeepSea); reward float32;
  done, success, valid bool; info: dict of arrays (always has "terminated", "truncated").
  """

  obs: np.ndarray
  reward: np.ndarray
  done: np.ndarray
  success: np.ndarray
  valid: np.ndarray
  info: dict


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
# VizDoom through envpool.


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


def quiesce_blas_thread_pools() -> list[str]:
  """Stops the worker threads of every OpenBLAS loaded in this process; returns their paths.

  OpenBLAS's fork handler is then a no-op (no pool to join), so concurrent forks cannot race
  in it (module docstring); OpenBLAS restarts its pool by itself on its next call, as it does
  after every fork. Call it from one thread while no other thread is inside a BLAS call.
  Linux only (``/proc/self/maps``); a library without the symbol is skipped.
  """
  try:
    with open("/proc/self/maps") as f:
      paths = sorted(
          {
              line.split(maxsplit=5)[5].strip()
              for line in f
              if "openblas" in line.rsplit("/", 1)[-1].lower() and len(line.split(maxsplit=5)) == 6
          }
      )
  except OSError:
    return []
  stopped = []
  for path in paths:
    try:  # RTLD_NOLOAD: a handle to the copy already mapped, never a new load
      lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
      shutdown = lib.blas_thread_shutdown_
    except (OSError, AttributeError):
      continue
    shutdown()
    stopped.append(path)
  return stopped


def vizdoom_binary() -> Path:
  """envpool's ViZDoom executable: the program every game process runs."""
  import envpool  # VizDoom only (the [rl] extra); DeepSea runs without it

  return Path(envpool.__file__).resolve().parent / "vizdoom" / "bin" / "vizdoom"


def game_processes(binary: str | os.PathLike | None = None) -> set[int]:
  """Pids of this process's live children running ``binary`` (default: ``vizdoom_binary()``)."""
  exe = os.path.realpath(binary if binary is not None else vizdoom_binary())
  me, out = os.getpid(), set()
  for name in os.listdir("/proc"):
    if not name.isdigit():
      continue
    try:
      with open(f"/proc/{name}/stat") as f:
        ppid = int(f.read().rsplit(")", 1)[1].split()[1])
      if ppid == me and os.readlink(f"/proc/{name}/exe") == exe:
        out.add(int(name))
    except (OSError, IndexError, ValueError):  # gone, a zombie, or not ours to read
      continue
  return out


def kill_games(pids, binary: str | os.PathLike | None = None) -> list[int]:
  """SIGKILLs those of ``pids`` that are still this process's ViZDoom games; returns them.

  Re-checked against ``game_processes`` first, so a recycled pid is never signalled.
  """
  alive = sorted(set(pids) & game_processes(binary))
  for pid in alive:
    with contextlib.suppress(ProcessLookupError):
      os.kill(pid, signal.SIGKILL)
  return alive


def kill_all_games() -> list[int]:
  """``kill_games`` of every ViZDoom game this process started (none without envpool)."""
  try:
    return kill_games(game_processes())
  except ImportError:
    return []


# The guardian: a small stdlib-only process per VizDoom env. envpool builds its games with the
# GIL held, so a start that hangs in C++ also stops every Python thread, the ``Watchdog``
# included; and games outlive a parent that dies without closing them (SIGKILL, os._exit).
# The guardian needs neither the GIL nor the parent: it reads a pipe from the parent.
# argv: parent pid, start timeout (s), game binary, games present before the start, message.
_GUARDIAN = r"""
import os, select, signal, sys, time
parent, timeout, binary = int(sys.argv[1]), float(sys.argv[2]), os.path.realpath(sys.argv[3])
before = {int(p) for p in sys.argv[4].split(",") if p}
message = sys.argv[5]

def games(ppid):
    out = set()
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/stat") as f:
                pp = int(f.read().rsplit(")", 1)[1].split()[1])
            if (ppid is None or pp == ppid) and os.readlink(f"/proc/{name}/exe") == binary:
                out.add(int(name))
        except (OSError, IndexError, ValueError):
            continue
    return out

def kill(pids):
    alive = pids & games(None)
    for pid in alive:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return alive

known, buf, deadline = set(), b"", time.monotonic() + timeout
while True:  # starting: collect the games as they come up, until "started" or the deadline
    left = deadline - time.monotonic()
    if left <= 0:
        killed = kill(games(parent) - before | known)
        sys.stderr.write(f"{message} gave no reply within {timeout:g} s (the start holds the "
                         f"GIL); {len(killed)} game(s) had come up (killed); process stopped\n")
        sys.stderr.flush()
        os.kill(parent, signal.SIGKILL)
        sys.exit(1)
    known |= games(parent) - before
    if select.select([0], [], [], min(left, 0.5))[0]:
        data = os.read(0, 4096)
        if not data:
            kill(known)
            sys.exit(0)
        buf += data
        if b"\n" in buf:
            known = {int(p) for p in buf.split(b"\n", 1)[0].split(b",") if p}
            break
while os.read(0, 4096):  # running: wait for the parent to close the pipe, or to die
    pass
kill(known)
"""


class Guardian:
  """The guardian process of one VizDoom env start (``_GUARDIAN``).

  ``timeout_s``: a start still running then is ended from outside: its games are killed,
  ``message`` + the cause is written to stderr, and this process is SIGKILLed. After
  ``started(pids)``, the guardian kills those games once this process closes it or dies.
  """

  def __init__(self, timeout_s: float, before: set[int], message: str):
    self._proc = subprocess.Popen(
        [
            sys.executable,
            "-I",
            "-S",
            "-c",
            _GUARDIAN,
            str(os.getpid()),
            f"{timeout_s:g}",
            str(vizdoom_binary()),
            ",".join(map(str, sorted(before))),
            message,
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
    )

  def started(self, pids) -> None:
    self._proc.stdin.write((",".join(map(str, pids)) + "\n").encode())
    self._proc.stdin.flush()

  def close(self) -> None:
    """Lets the guardian kill what is left of the games, and waits for it."""
    if self._proc.stdin.closed:
      return
    self._proc.stdin.close()
    self._proc.wait()


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
    before = game_processes()
    quiesce_blas_thread_pools()
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
    return env, tuple(sorted(game_processes() - before))


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
  BLAS pools quiesced (module docstring). They end when the env is garbage-collected:
  envpool's ``close()`` does not stop them (``DoomVecEnv.close`` does).
  """
  return _start_games(files, num_envs, seed, work_dir, envpool_kwargs)[0]


def check_actions(env_id: str, actions, num_envs: int, num_actions: int) -> np.ndarray:
  """``actions`` as an int array of shape (num_envs,) in [0, num_actions), else ValueError."""
  a = np.asarray(actions)
  if a.shape != (num_envs,) or not np.issubdtype(a.dtype, np.integer):
    raise ValueError(
        f"{env_id}: actions must be integers of shape ({num_envs},), " f"got {a.dtype} {a.shape}"
    )
  if a.min() < 0 or a.max() >= num_actions:
    raise ValueError(
        f"{env_id}: actions must be in [0, {num_actions}), " f"got range [{a.min()}, {a.max()}]"
    )
  return a


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
    self.guardian: Guardian | None = None  # set by start_doom
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

  def step(self, actions) -> Step:
    """Steps all envs. ``actions``: ints in [0, num_actions), shape (num_envs,)."""
    if self._prev_done is None:
      raise RuntimeError(f"{self.env_id}: call reset() before step()")
    a = check_actions(self.env_id, actions, self.num_envs, self.num_actions)
    a = button_vectors(a, self.num_actions) if self.buttons else a.astype(np.int32)
    obs, raw_reward, terminated, truncated, info = self.env.step(a)
    reward, done, success, valid = transition_flags(terminated, truncated, self._prev_done)
    self._prev_done = done
    return Step(
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
    return kill_games(self.game_pids)


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
) -> "Watchdog":
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
  before = game_processes()
  label = getattr(getattr(sys.modules.get("__main__"), "__spec__", None), "name", None)
  guardian = Guardian(
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
    killed = kill_games(game_processes() - before)
    guardian.close()
    return f"{len(killed)} of {num_envs} ViZDoom games had come up (killed)"

  return Watchdog.start(build, env_id, timeout_s, cleanup=kill_started)


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


class EnvFailure(RuntimeError):
  """An environment call raised, or gave no reply within the watchdog's timeout."""


class Watchdog:
  """Runs an env's construction, ``reset``, ``step`` and ``close`` on a worker thread and
  waits at most ``timeout_s`` for each.

  An exception inside the env, or a call that does not return in time (a hung envpool worker,
  a ViZDoom game that never comes up), becomes one ``EnvFailure`` naming the env id and the
  call, so the training loop can checkpoint and stop instead of hanging. A hung call cannot be
  interrupted from Python: its (daemon) thread is abandoned, and the caller should exit the
  process (``os._exit``) rather than wait for the env's own threads at interpreter exit;
  ``close`` then kills the env (its ``kill()``, if it has one) instead of closing it.
  Other attributes pass through to the wrapped env. ``Watchdog.start`` builds the env on the
  worker thread too.
  """

  def __init__(self, env, timeout_s: float, env_id: str | None = None):
    if not timeout_s > 0:
      raise ValueError(f"timeout_s must be positive, got {timeout_s}")
    self._env, self.timeout_s = env, float(timeout_s)
    self.env_id = env_id or getattr(env, "env_id", type(env).__name__)
    self._calls: queue.Queue = queue.Queue()
    self._worker = None
    self.hung = False

  @classmethod
  def start(
      cls,
      factory: Callable[[], Any],
      env_id: str,
      timeout_s: float,
      *,
      cleanup: Callable[[], str] | None = None,
  ) -> "Watchdog":
    """The env ``factory()`` returns, built on the watchdog's worker thread.

    A factory that raises or gives no reply within ``timeout_s`` becomes an ``EnvFailure``
    "<env_id>: starting the env ...". ``cleanup`` runs on every failure, an interrupted
    wait (Ctrl-C) included, to end what the factory started; after a hang its text is
    appended to the error.
    """
    dog = cls(None, timeout_s, env_id=env_id)
    try:
      dog._env = dog._run(factory, (), "starting the env")
      dog.env_id = getattr(dog._env, "env_id", env_id)
    except EnvFailure as e:
      done = cleanup() if cleanup is not None else ""
      if dog.hung and done:
        raise EnvFailure(f"{e}; {done}") from None
      raise
    except BaseException:
      dog.hung = True  # the factory may still be running: the env is not usable
      if cleanup is not None:
        cleanup()
      raise
    return dog

  def __getattr__(self, name):
    return getattr(self._env, name)

  def _serve(self):
    while True:
      fn, args, out = self._calls.get()
      try:
        out.put((True, fn(*args)))
      except BaseException as e:  # noqa: BLE001  (handed to the caller)
        out.put((False, e))

  def _run(self, fn: Callable, args: tuple, what: str):
    if self.hung:
      raise EnvFailure(f"{self.env_id}: an earlier call hung; the env cannot be used")
    if self._worker is None:
      self._worker = threading.Thread(target=self._serve, daemon=True, name=f"env-{self.env_id}")
      self._worker.start()
    out: queue.Queue = queue.Queue(maxsize=1)
    self._calls.put((fn, args, out))
    try:
      ok, value = out.get(timeout=self.timeout_s)
    except queue.Empty:
      self.hung = True
      raise EnvFailure(
          f"{self.env_id}: {what} gave no reply within " f"{self.timeout_s:g} s (hung worker?)"
      ) from None
    if not ok:
      raise EnvFailure(
          f"{self.env_id}: {what} failed: " f"{type(value).__name__}: {value}"
      ) from value
    return value

  def _call(self, name: str, *args):
    return self._run(getattr(self._env, name), args, f"env.{name}()")

  def reset(self):
    return self._call("reset")

  def step(self, actions):
    return self._call("step", actions)

  def close(self) -> None:
    """Closes the env; if that is impossible (an earlier call hung) or fails, kills it."""
    if self._env is None:
      return
    if not self.hung:
      try:
        self._call("close")
        return
      except EnvFailure:
        pass
    kill = getattr(self._env, "kill", None)
    if kill is not None:
      kill()


# ----------------------------------------------------------------------------------------------
# DeepSea (bsuite) in JAX, via gymnax's DeepSea-bsuite dynamics.


class DeepSeaState(NamedTuple):
  """Batched DeepSea state: gymnax env states (leading dim num_envs), reset flags, PRNG key."""

  env_state: Any
  needs_reset: Any  # bool (num_envs,): the previous step ended the episode
  key: Any


def deep_sea_fns(
    size: int, num_envs: int, mapping_seed: int = 0, deterministic: bool = True
) -> tuple[Callable, Callable]:
  """Pure, jitted (reset, step) for ``num_envs`` copies of one DeepSea(size) MDP.

  The action that moves right is drawn per cell (row, column) from ``mapping_seed``, as bsuite
  does (gymnax's ``randomize_actions``), shared by all envs, fixed across episodes.
  ``reset(key) -> (state, obs)``; ``step(state, actions) -> (state, Step)`` with jax arrays:
  obs float32 (num_envs, size*size), the flattened one-hot (row, column) grid (all zeros once
  the agent has left the last row); reward float32: 1 at the treasure (bottom-right cell,
  reached by moving right N times), -0.01/N per right move; ``done`` after exactly ``size``
  steps (terminated, never truncated); success = treasure reward collected; envpool-style
  auto-reset on the next call with ``valid = False``.
  """
  from gymnax.environments.bsuite.deep_sea import DeepSea  # DeepSea only; VizDoom runs without it

  if int(size) < 1 or int(num_envs) < 1:
    raise ValueError(f"size and num_envs must be >= 1, got size={size}, num_envs={num_envs}")
  env = DeepSea(size=int(size), action_mapping_key=jax.random.key(int(mapping_seed)))
  params = env.default_params.replace(deterministic=bool(deterministic))

  def reset_one(key):
    obs, s = env.reset_env(key, params)
    return s, obs.reshape(-1)

  def step_one(key, s, needs_reset, action):
    k_reset, k_step = jax.random.split(key)
    s_reset, obs_reset = reset_one(k_reset)
    obs_step, s_step, reward, terminated, _ = env.step_env(k_step, s, action, params)
    truncated = (s_step.time >= params.max_steps_in_episode) & ~terminated
    success = s_step.denoised_return > s.denoised_return
    s_new = jax.tree.map(lambda r, t: jnp.where(needs_reset, r, t), s_reset, s_step)
    obs = jnp.where(needs_reset, obs_reset, obs_step.reshape(-1))
    live = ~needs_reset
    return (
        s_new,
        obs,
        jnp.where(live, reward, 0.0).astype(jnp.float32),
        live & (terminated | truncated),
        live & success,
        live & terminated,
        live & truncated,
    )

  @jax.jit
  def reset(key):
    k_envs, k_next = jax.random.split(key)
    s, obs = jax.vmap(reset_one)(jax.random.split(k_envs, num_envs))
    return DeepSeaState(s, jnp.zeros(num_envs, bool), k_next), obs

  @jax.jit
  def step(state: DeepSeaState, actions):
    k_envs, k_next = jax.random.split(state.key)
    s, obs, reward, done, success, term, trunc = jax.vmap(step_one)(
        jax.random.split(k_envs, num_envs),
        state.env_state,
        state.needs_reset,
        jnp.asarray(actions, jnp.int32),
    )
    valid = ~state.needs_reset
    info = {"terminated": term, "truncated": trunc, "row": s.row, "column": s.column}
    return DeepSeaState(s, done, k_next), Step(obs, reward, done, success, valid, info)

  return reset, step


class DeepSeaVecEnv:
  """Stateful numpy wrapper of ``deep_sea_fns`` with the same interface as ``DoomVecEnv``.

  ``action_mapping``: int (size, size), the action that moves right in each cell.
  """

  def __init__(
      self, size: int, num_envs: int, seed: int, mapping_seed: int = 0, deterministic: bool = True
  ):
    self.size, self.num_envs, self.num_actions = int(size), int(num_envs), 2
    self.obs_shape = (self.size * self.size,)
    self.env_id = f"DeepSea-{self.size} (gymnax DeepSea-bsuite, {self.num_envs} envs)"
    self._reset, self._step = deep_sea_fns(size, num_envs, mapping_seed, deterministic)
    self._key = jax.random.key(int(seed))
    self._state = None

  @property
  def action_mapping(self) -> np.ndarray:
    if self._state is None:
      raise RuntimeError(f"{self.env_id}: call reset() first")
    return np.asarray(self._state.env_state.action_mapping[0])

  def reset(self) -> tuple[np.ndarray, dict]:
    """Resets all envs. Returns obs float32 (num_envs, size*size) and info (row, column)."""
    self._key, k = jax.random.split(self._key)
    self._state, obs = self._reset(k)
    s = self._state.env_state
    return np.asarray(obs), {"row": np.asarray(s.row), "column": np.asarray(s.column)}

  def step(self, actions) -> Step:
    """Steps all envs. ``actions``: ints in {0, 1}, shape (num_envs,)."""
    if self._state is None:
      raise RuntimeError(f"{self.env_id}: call reset() before step()")
    a = check_actions(self.env_id, actions, self.num_envs, self.num_actions)
    self._state, out = self._step(self._state, a)
    return Step(*(np.asarray(x) for x in out[:5]), {k: np.asarray(v) for k, v in out.info.items()})
