"""What every binary shares: one ``--config`` (a ``configs/<name>.py`` file whose ``get_config``
returns an ``ml_collections.ConfigDict``), checks that fail in one line, the record of a run, and
the config's forms: a config file builds an editable ``ConfigDict`` (``editable``), the binary
converts it once into the frozen value the code below uses as it is (``freeze``), and
``to_dict`` gives the plain JSON values of either.

A binary's experiment settings live in its config and are overridden on the command line::

    python -m benchmarks.ood --config.seeds=5 --config.method.csd.num_steps=2000
    python -m rl.vizdoom --config=configs/vizdoom.py:paper   # a named profile (get_config(arg))

Where a run writes (``--out_dir``) and how it spreads over devices (``--mesh`` and the
multi-process flags of ``launch``) stay flags: they do not change what is computed.
"""

from __future__ import annotations

import ast
import json
import os
import re
import sys
from typing import Any, Callable, Iterable, Mapping, NoReturn

import ml_collections
from absl import app
from absl import flags
from absl import logging
from ml_collections import config_dict
from ml_collections import config_flags

from cmdline import flag_checks
import configs

ConfigDict = ml_collections.ConfigDict


class ConfigError(ValueError):
  """A config value a binary cannot run with; the message names ``--config.<path>``."""


def config_path(name: str) -> str:
  """The absolute path of ``configs/<name>.py`` (the default ``--config`` of binary ``name``)."""
  path = os.path.join(os.path.dirname(os.path.abspath(configs.__file__)), f"{name}.py")
  if not os.path.exists(path):
    raise FileNotFoundError(f"no config file {path}")
  return path


def define_config(name: str) -> flags.FlagHolder:
  """Defines ``--config`` (default ``configs/<name>.py``, or ``name`` itself when it is a path
  to a ``.py`` file; locked: an override of a field the config lacks fails). Returns the flag
  holder (``.value`` is the ConfigDict).

  ml_collections reads the ``--config.`` overrides from ``sys.argv`` here, so a misspelt field
  ends the program now, in one line."""
  path = name if name.endswith(".py") else config_path(name)
  try:
    return config_flags.DEFINE_config_file(
        "config",
        path,
        f"Experiment config: a configs/*.py file (default {os.path.basename(path)}; "
        "'file.py:arg' passes arg to get_config), its fields overridden with "
        "--config.<field>=value.",
        lock_config=True,
    )
  except (AttributeError, KeyError) as e:
    fail(f"Config error: {_missing_field(e, sys.argv)}")
  except (TypeError, ValueError) as e:
    fail(f"Config error: {_message(e)}")


def define_out_dir_and_config(name: str, out_dir: str | None = None) -> flags.FlagHolder:
  """A benchmark binary's flags: ``--out_dir`` (default ``out_dir`` or out/<name>; checked
  writable when flags are parsed) and ``--config`` (``define_config(name)``)."""
  flags.DEFINE_string("out_dir", out_dir or f"out/{name}", "Output directory.")
  flag_checks.writable_dir("out_dir")
  return define_config(name)


def reload_config(profile: str, name: str = "config") -> ConfigDict:
  """``--<name>``'s config file built again as ``get_config(profile)``, with the command line's
  ``--<name>.<field>`` overrides applied again. For a profile part that can only be decided once
  the program has started (e.g. from JAX's backend, which a multi-process run may only query
  after ``jax.distributed.initialize``); call it after the flags are parsed."""
  flag = flags.FLAGS[name]
  path = config_flags.get_config_filename(flag).split(":", 1)[0]
  config = flag.parser.parse(f"{path}:{profile}")
  config.update_from_flattened_dict(config_flags.get_override_values(flag))
  return config


def _message(e: Exception) -> str:
  text = str(e).replace("\\'", "'").replace("\\n", " ")
  return " ".join(text.strip("'\"").split())


def _missing_field(e: KeyError | AttributeError, argv: list[str]) -> str:
  """ml_collections' error for a ``--config.`` override of a field that does not exist names
  only the key ("'dqn'", "'nmae' Did you mean ...?"): said with the flags that name that key.
  Any other such error as it is."""
  match = re.fullmatch(r"\W*(\w+)\W*(.*)", _message(e))
  key, rest = match.groups() if match else ("", "")
  named = [
      a.partition("=")[0]
      for a in argv
      if a.startswith("--config.") and key in a.partition("=")[0].split(".")
  ]
  if not named:
    return _message(e)
  return f"no field {key!r} in the config ({', '.join(named)})" + (f". {rest}" if rest else "")


def _one_line(text: str) -> str:
  """An error as one line; one raised inside a config file's ``get_config`` arrives with its
  traceback, of which the last line (the exception) is kept."""
  lines = [line.strip() for line in text.splitlines() if line.strip()]
  if any(line.startswith("Traceback") for line in lines):
    lines = [lines[0], lines[-1]]
  return " ".join(lines)


def fail(message: str) -> NoReturn:
  """Ends the program with one line on stderr and exit status 1."""
  print(f"FATAL {message}", file=sys.stderr, flush=True)
  sys.exit(1)


def parse_flags(argv: list[str]) -> list[str]:
  """``app.run``'s ``flags_parser``: parses argv; a bad flag, an unknown ``--config.`` field or
  a config file that does not load ends the program in one line instead of a traceback."""
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    fail(f"Flags parsing error: {_one_line(str(e))}")
  except (AttributeError, KeyError) as e:
    fail(f"Config error: {_missing_field(e, argv)}")
  except (TypeError, ValueError, FileNotFoundError) as e:
    fail(f"Config error: {_message(e)}")


def run(main: Callable[[list[str]], Any]) -> None:
  """``app.run(main)`` with ``parse_flags``, and a ``ConfigError`` raised by ``main`` (from
  ``check``) reported in one line."""

  def checked_main(argv):
    try:
      return main(argv)
    except ConfigError as e:
      fail(f"Config error: {e}")

  app.run(checked_main, flags_parser=parse_flags)


def lookup(config: ConfigDict, path: str) -> Any:
  """The value at a dotted ``path`` (``"method.csd.num_steps"``)."""
  value = config
  for part in path.split("."):
    value = value[part]
  return value


def set_field(config: ConfigDict, path: str, text: str) -> None:
  """Sets the field at a dotted ``path`` from ``text`` as ``--config.<path>=<text>`` would: a
  Python literal for a non-string field, of the field's type (ints widen to floats);
  ``ConfigError`` for an unknown field or a value of another type."""
  *parents, name = path.split(".")
  try:
    node = lookup(config, ".".join(parents)) if parents else config
    old = node[name]
  except (KeyError, AttributeError, TypeError):
    raise ConfigError(f"--config.{path}: no such field") from None
  if isinstance(old, str):
    value = text
  else:
    try:
      value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
      raise ConfigError(f"--config.{path}: {text!r} is not a Python literal") from None
  if isinstance(old, bool) != isinstance(value, bool):
    raise ConfigError(f"--config.{path}: needs a value of the type of {old!r}, got {text!r}")
  try:
    node[name] = value
  except TypeError as e:
    raise ConfigError(f"--config.{path}: {e}") from None


def _values(config: ConfigDict, paths: Iterable[str]):
  for path in paths:
    value = lookup(config, path)
    if value is not None:
      yield path, value


def check(
    config: ConfigDict,
    *,
    positive: Iterable[str] = (),
    non_negative: Iterable[str] = (),
    unit_interval: Iterable[str] = (),
    open_unit_interval: Iterable[str] = (),
    one_of: dict[str, Iterable] | None = None,
    subset_of: dict[str, Iterable] | None = None,
) -> None:
  """Raises ``ConfigError`` naming ``--config.<path>`` for the first field out of range.

  ``None`` values pass (an optional field not set). ``one_of``: {path: allowed values};
  ``subset_of``: {path: allowed items} for a comma-separated string or a sequence.
  """
  for path, v in _values(config, positive):
    if not v > 0:
      raise ConfigError(f"--config.{path} must be positive, got {v!r}")
  for path, v in _values(config, non_negative):
    if not v >= 0:
      raise ConfigError(f"--config.{path} must be >= 0, got {v!r}")
  for path, v in _values(config, unit_interval):
    if not 0.0 <= v <= 1.0:
      raise ConfigError(f"--config.{path} must be in [0, 1], got {v!r}")
  for path, v in _values(config, open_unit_interval):
    if not 0.0 < v <= 1.0:
      raise ConfigError(f"--config.{path} must be in (0, 1], got {v!r}")
  for path, allowed in (one_of or {}).items():
    allowed = tuple(allowed)
    v = lookup(config, path)
    if v not in allowed:
      raise ConfigError(
          f"--config.{path} must be one of {', '.join(map(str, allowed))}; " f"got {v!r}"
      )
  for path, allowed in (subset_of or {}).items():
    allowed = tuple(allowed)
    items = split_list(lookup(config, path))
    unknown = [i for i in items if i not in allowed]
    if unknown or not items:
      raise ConfigError(
          f"--config.{path} must be a non-empty comma-separated list from "
          f"{', '.join(map(str, allowed))}; got {', '.join(map(str, unknown)) or 'nothing'}"
      )


def split_list(value: str | Iterable) -> list:
  """A comma-separated string (``"csd,ens15"``) or a sequence, as a list (empty items dropped)."""
  if isinstance(value, str):
    return [v.strip() for v in value.split(",") if v.strip()]
  return list(value)


def to_dict(config: ConfigDict | Mapping) -> dict:
  """A config (ConfigDict, FrozenConfigDict or nested mapping) as plain JSON values: dicts,
  lists (tuples become lists), numbers, strings, None. For results and checkpoint identities."""
  if isinstance(config, ConfigDict):
    return json.loads(config.to_json_best_effort())
  return json.loads(json.dumps(config))


def freeze(config: ConfigDict | Mapping) -> ml_collections.FrozenConfigDict:
  """The frozen (hashable, immutable) value of a config that the code below a binary uses as it
  is; lists become tuples. Built from the plain values, so equal values give equal, equally
  hashed configs whatever the source's ConfigDict settings (a FrozenConfigDict compares those)."""
  return ml_collections.FrozenConfigDict(to_dict(config))


def replace(config: ml_collections.FrozenConfigDict, **updates) -> ml_collections.FrozenConfigDict:
  """The frozen ``config`` with top-level fields replaced (each must exist)."""
  missing = sorted(set(updates) - set(config.keys()))
  if missing:
    raise ValueError(f"unknown config keys {missing}; valid keys: {sorted(config.keys())}")
  return freeze({**to_dict(config), **updates})


def editable(defaults: Mapping) -> ConfigDict:
  """A config file's ``ConfigDict`` of plain ``defaults``, every field overridable on the
  command line: a None field becomes a placeholder that takes any literal
  (``--config.method.rnd.num_steps=300``), a list a tuple (the command line overrides tuples)."""

  def field(v):
    if isinstance(v, Mapping):
      return {k: field(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
      return tuple(field(x) for x in v)
    return config_dict.placeholder(object) if v is None else v

  return ConfigDict(field(defaults))


def start(
    argv: list[str],
    config: ConfigDict,
    out_dir: str,
    name: str,
    check_config: Callable[[ConfigDict], Any],
) -> None:
  """A config binary's start: no positional arguments, absl logging at warnings, the config
  checked (``check_config`` raises ``ConfigError`` before any work) and recorded in
  ``out_dir`` (``record``)."""
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  logging.set_verbosity(logging.WARNING)
  check_config(config)
  record(out_dir, name, config)


def record(out_dir: str, name: str, config: ConfigDict) -> str:
  """Writes ``out_dir/<name>.config.json`` (the full config that ran) next to
  ``<name>.flags`` (the command line, a flagfile: ``flag_checks.record``). Returns its path."""
  flag_checks.record(out_dir, name)
  path = os.path.join(out_dir, f"{name}.config.json")
  with open(path + ".tmp", "w") as f:
    json.dump(to_dict(config), f, indent=1, sort_keys=True)
  os.replace(path + ".tmp", path)
  return path
