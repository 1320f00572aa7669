"""What every validation binary shares: its command line, float64, progress lines and output.

A binary ``validation/<name>.py`` has a ``run(config, out_dir) -> dict`` that does the work (the
tests call it in-process with small configs) and writes ``out_dir/<name>.json`` and
``out_dir/<name>*.png``; its ``__main__`` is ``runner.main(NAME, run, check_config)``::

    python -m validation.<name> --out_dir=DIR [--config=configs/<name>.py:quick] [--config.seed=1]

The experiment (sizes, widths, seeds) is ``configs/<name>.py``; ``--out_dir`` is the only flag.
"""

from __future__ import annotations

import json
import math
import os
import time
from typing import Any, Callable

import jax
import ml_collections
import numpy as np
from absl import app
from absl import flags

from cmdline import cli
from cmdline import flag_checks

FLAGS = flags.FLAGS

_START = time.perf_counter()


def enable_x64() -> None:
  """Turns float64 on (the validation numbers are about float64). Call before any array."""
  jax.config.update("jax_enable_x64", True)


def log(name: str, msg: str) -> None:
  """A progress line on stdout: ``[name  12.3s] msg``."""
  print(f"[{name} {time.perf_counter() - _START:7.1f}s] {msg}", flush=True)


def _jsonable(obj: Any) -> Any:
  if isinstance(obj, ml_collections.ConfigDict):
    return cli.to_dict(obj)
  if isinstance(obj, dict):
    return {str(k): _jsonable(v) for k, v in obj.items()}
  if isinstance(obj, (list, tuple)):
    return [_jsonable(v) for v in obj]
  if isinstance(obj, (bool, np.bool_)):
    return bool(obj)
  if isinstance(obj, (int, np.integer)):
    return int(obj)
  if isinstance(obj, (float, np.floating)):
    v = float(obj)
    return v if math.isfinite(v) else str(v)
  if hasattr(obj, "shape"):  # numpy / jax array
    return _jsonable(np.asarray(obj).tolist())
  return obj


def write_json(out_dir: str, name: str, result: dict) -> str:
  """Writes ``out_dir/name.json`` (numpy, jax and ConfigDict values converted); returns the
  path."""
  os.makedirs(out_dir, exist_ok=True)
  path = os.path.join(out_dir, f"{name}.json")
  with open(path, "w") as f:
    json.dump(_jsonable(result), f, indent=2, sort_keys=False)
    f.write("\n")
  return path


def define_flags(name: str) -> flags.FlagHolder:
  """Defines ``--out_dir`` and ``--config`` (default ``configs/<name>.py``); returns the config's
  flag holder. Called from ``main`` only, never at import: importing several binaries into one
  process (the tests do) must define no flag."""
  flags.DEFINE_string("out_dir", "out/validation", "Folder for <name>.json and <name>*.png.")
  flag_checks.writable_dir("out_dir")
  return cli.define_config(name)


def main(
    name: str,
    run: Callable[[ml_collections.ConfigDict, str], dict],
    check_config: Callable[[ml_collections.ConfigDict], None],
) -> None:
  """Parses the command line, checks the config (one ``FATAL`` line if it is out of range),
  records it next to the outputs (``<name>.flags``, ``<name>.config.json``) and runs."""
  config = define_flags(name)

  def _main(argv):
    if len(argv) > 1:
      raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    check_config(config.value)
    cli.record(FLAGS.out_dir, name, config.value)
    run(config.value, FLAGS.out_dir)

  cli.run(_main)
