"""A watchdog for env calls: an env that raises or hangs becomes one ``EnvFailure``.

envpool's calls run in C++ worker threads that Python cannot interrupt; a game that never comes
up or a worker that hangs would otherwise stop a training run forever. ``rl.doom_env.start_doom``
runs the VizDoom env under one; ``rl.game_guard`` covers the start-up that holds the GIL.
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable


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
