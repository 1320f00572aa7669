"""The guardian of one VizDoom env start: a small stdlib-only program (``rl.game_guard.Guardian``).

    python -I -S rl/guardian_process.py PARENT_PID TIMEOUT_S GAME_BINARY BEFORE_PIDS MESSAGE

envpool builds its games with the GIL held, so a start that hangs in C++ also stops every
Python thread of the parent, its watchdog included; and games outlive a parent that dies without
closing them (SIGKILL, ``os._exit``). This process needs neither the GIL nor the parent: it
reads a pipe (stdin) from the parent.

* Starting: it collects the parent's new games (children running GAME_BINARY, not in the
  comma-separated BEFORE_PIDS) until the parent writes one line, the comma-separated pids of
  its env's games. If TIMEOUT_S passes first, it kills the new games, writes MESSAGE and the
  cause to stderr and SIGKILLs the parent. If the pipe closes first, it kills what it collected.
* Running: once the parent closes the pipe (``Guardian.close``) or dies, it kills those games.

Stdlib only and run as a script, not imported: it starts in an isolated interpreter without
this package on its path.
"""

import os
import select
import signal
import sys
import time


def games(binary: str, ppid: int | None) -> set[int]:
  """Pids of the live processes running ``binary`` (a real path) whose parent is ``ppid``
  (any parent if None)."""
  out = set()
  for name in os.listdir("/proc"):
    try:
      with open(f"/proc/{name}/stat") as f:
        pp = int(f.read().rsplit(")", 1)[1].split()[1])
      if (ppid is None or pp == ppid) and os.readlink(f"/proc/{name}/exe") == binary:
        out.add(int(name))
    except (OSError, IndexError, ValueError):  # not a pid, gone, a zombie, or not ours to read
      continue
  return out


def kill(binary: str, pids: set[int]) -> set[int]:
  """SIGKILLs those of ``pids`` that still run ``binary`` (a recycled pid is spared)."""
  alive = pids & games(binary, None)
  for pid in alive:
    try:
      os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
      pass
  return alive


def main(argv: list[str]) -> int:
  """Guards one start (module docstring); ``argv``: the five arguments. Returns the exit code
  (1 after ending a start that timed out, else 0)."""
  parent, timeout, binary = int(argv[0]), float(argv[1]), os.path.realpath(argv[2])
  before = {int(p) for p in argv[3].split(",") if p}
  message = argv[4]
  known, buf, deadline = set(), b"", time.monotonic() + timeout
  while True:  # starting: collect the games as they come up, until "started" or the deadline
    left = deadline - time.monotonic()
    if left <= 0:
      killed = kill(binary, games(binary, parent) - before | known)
      sys.stderr.write(
          f"{message} gave no reply within {timeout:g} s (the start holds the "
          f"GIL); {len(killed)} game(s) had come up (killed); process stopped\n"
      )
      sys.stderr.flush()
      os.kill(parent, signal.SIGKILL)
      return 1
    known |= games(binary, parent) - before
    if select.select([0], [], [], min(left, 0.5))[0]:
      data = os.read(0, 4096)
      if not data:
        kill(binary, known)
        return 0
      buf += data
      if b"\n" in buf:
        known = {int(p) for p in buf.split(b"\n", 1)[0].split(b",") if p}
        break
  while os.read(0, 4096):  # running: wait for the parent to close the pipe, or to die
    pass
  kill(binary, known)
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
