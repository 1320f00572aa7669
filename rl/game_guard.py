"""Starting ViZDoom games safely, and ending them: the game-process guard of ``rl.doom_env``.

envpool starts its ViZDoom games from several threads at once, each with ``fork()``, so every
fork handler in the process runs concurrently with itself. OpenBLAS's
(``blas_thread_shutdown_``, joins the BLAS worker threads) is not safe for that in builds without
its lock, e.g. the OpenBLAS 0.3.30 bundled with scipy 1.17 (OpenMathLib/OpenBLAS#3111 fixed this
once; #5479 removed the lock again, #5569 restored it): two forks join the same worker and the
second waits forever on a recycled thread handle, so one game never starts and ``envpool.make``
never returns. ``quiesce_blas_thread_pools`` stops those pools before the games start.

The games are this process's children running ``vizdoom_binary()`` (found through ``/proc``):
``kill_games`` ends a hung env's games. A start that hangs inside envpool holds the GIL, so no
Python thread can time it out; the ``Guardian`` (a separate process, ``rl/guardian_process.py``)
does, and it also ends the games if this process dies without closing them. Linux only.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
from pathlib import Path


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


# The guardian's program: stdlib only, run as a script in an isolated interpreter (-I -S), so
# it starts fast and needs neither this package nor the parent's GIL.
GUARDIAN_PROGRAM = Path(__file__).resolve().with_name("guardian_process.py")


class Guardian:
  """The guardian process of one VizDoom env start (``rl/guardian_process.py``).

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
            str(GUARDIAN_PROGRAM),
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
