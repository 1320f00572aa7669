"""Up-front checks of a binary's absl flags: bad values fail at parse time, in one line.

Each function registers absl validators for flags the binary has already defined (it defines
no flag itself, and nothing happens at import). absl runs them while parsing ``argv``, before
``main``, and reports a failure as one line, no traceback::

    FATAL Flags parsing error: flag --out_dir=/proc/x: --out_dir=/proc/x is not a writable folder

Typical use, at the end of a binary's ``define_flags()``::

    flag_checks.writable_dir("out_dir")
    flag_checks.writable_dir("checkpoint_dir", optional=True)

and, in ``main``, ``flag_checks.record(out_dir, "ood")`` writes ``out_dir/ood.flags``: every flag
of the binary as ``--name=value``, a file that ``--flagfile=out_dir/ood.flags`` replays to
reproduce the run. What a run computes is checked in its config instead (``cli.check``).
"""

from __future__ import annotations

import os
import sys
import tempfile
from typing import Any, Callable, Iterable

from absl import flags


def _register(name: str, ok: Callable[[Any], bool], message: str) -> None:
  flags.register_validator(name, ok, message=message)


def positive(*names: str) -> None:
  """Each flag is None (unset, meaning 'the default') or > 0."""
  for name in names:
    _register(name, lambda v: v is None or v > 0, f"--{name} must be positive")


def non_negative(*names: str) -> None:
  """Each flag is None or >= 0."""
  for name in names:
    _register(name, lambda v: v is None or v >= 0, f"--{name} must be >= 0")


def positive_ints(name: str) -> None:
  """A list flag whose every item is a positive integer (e.g. ``--sizes=10,20``)."""

  def ok(values):
    return all(str(v).strip().isdigit() and int(v) > 0 for v in values or ())

  _register(name, ok, f"--{name} must be a comma-separated list of positive integers")


def writable_dir(name: str, optional: bool = False) -> None:
  """A folder that can be written: it is created if missing (the binary would create it
  anyway) and a temporary file is written and removed, which also catches what
  ``os.access`` misses as root (read-only mounts, /proc). ``optional``: unset is fine."""

  def ok(path):
    if not path and optional:
      return True
    if not path:
      raise flags.ValidationError(f"--{name} must not be empty")
    path = os.path.abspath(os.path.expanduser(path))
    try:
      os.makedirs(path, exist_ok=True)
      with tempfile.TemporaryFile(dir=path):
        pass
    except OSError as e:
      raise flags.ValidationError(
          f"--{name}={path} is not a writable folder: " f"{e.strerror or e}"
      ) from None
    return True

  _register(name, ok, f"--{name} is not a writable folder")


def mesh(name: str, distributed_flags: Iterable[str] = ()) -> None:
  """A ``parallel.make_mesh`` spec (``''`` or e.g. ``'data=8'``) that the visible devices can
  hold. When one of ``distributed_flags`` is set, the devices are not known before
  ``jax.distributed.initialize``: only the syntax is checked."""
  names = [name, *distributed_flags]

  def ok(values):
    spec = values[name]
    if not spec:
      return True
    from csd_jax import parallel  # pylint: disable=g-import-not-at-top  (imports jax)

    try:
      if any(values[n] for n in distributed_flags):
        parallel.parse_mesh(spec)  # syntax only: asks JAX for no device
      else:
        parallel.make_mesh(spec)
    except ValueError as e:
      raise flags.ValidationError(f"--{name}={spec}: {e}") from None
    return True

  flags.register_multi_flags_validator(names, ok, message=f"--{name} is invalid")


def requires(
    name: str, condition: Callable[[dict], bool], message: str, others: Iterable[str]
) -> None:
  """An incompatible-combination check: when ``--name`` is set (truthy), ``condition`` of the
  flag values (a dict over ``name`` and ``others``) must hold, else ``message``."""
  names = [name, *others]

  def ok(values):
    return not values[name] or condition(values)

  flags.register_multi_flags_validator(names, ok, message=message)


_OWN_MODULES = (
    "__main__",
    "cmdline",
    "csd_jax",
    "uncertainty_kit",
    "validation",
    "benchmarks",
    "rl",
)


def record(out_dir: str, name: str) -> str:
  """Writes ``out_dir/<name>.flags``: the binary's own flags (not absl's or other libraries')
  as ``--flag=value`` lines, a flagfile that reproduces the run. Returns the path."""
  spec = getattr(sys.modules.get("__main__"), "__spec__", None)
  program = ["python", "-m", spec.name] if spec is not None else ["python", sys.argv[0]]
  lines = [f"# {' '.join(program + sys.argv[1:])}"]
  for flag_name in sorted(flags.FLAGS):
    module = flags.FLAGS.find_module_defining_flag(flag_name) or ""
    # absl names the main module (flags defined under ``__main__``) by its path, sys.argv[0]
    own = (
        module == sys.argv[0]
        or module.split(".")[0] in _OWN_MODULES
        or flag_name.startswith("config.")
    )  # --config overrides (ml_collections)
    if own and flags.FLAGS[flag_name].name == flag_name:
      lines.append(flags.FLAGS[flag_name].serialize())
  os.makedirs(out_dir, exist_ok=True)
  path = os.path.join(out_dir, f"{name}.flags")
  with open(path, "w") as f:
    f.write("\n".join(line for line in lines if line) + "\n")
  return path
