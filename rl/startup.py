"""The RL binaries' shared flags (where a run writes, nothing it computes) and process set-up
(absl verbosity, multi-process launch, the XLA compilation cache)."""

from __future__ import annotations

import os

import jax
from absl import flags
from absl import logging

from cmdline import flag_checks
from cmdline import launch

FLAGS = flags.FLAGS


def define_flags(default_out_dir: str) -> None:
  """``--out_dir``, ``--checkpoint_dir``, ``--tensorboard``, ``--jax_cache_dir`` and the launch
  flags (``--mesh``, multi-process); call from a binary's ``define_flags``."""
  flags.DEFINE_string(
      "out_dir",
      default_out_dir,
      "Output folder (summary, plot, TensorBoard, "
      "checkpoints); rerun with the same config to resume.",
  )
  flags.DEFINE_string(
      "checkpoint_dir",
      None,
      "Checkpoint folder (default OUT_DIR/checkpoints); "
      "a rerun with the same config resumes from it.",
  )
  flags.DEFINE_bool("tensorboard", True, "Write TensorBoard scalars to OUT_DIR/tb.")
  flags.DEFINE_string(
      "jax_cache_dir", "~/.cache/csd_jax/xla", "Persistent XLA compilation cache ('' disables)."
  )
  launch.define_flags()
  flag_checks.writable_dir("out_dir")
  flag_checks.writable_dir("checkpoint_dir", optional=True)


def setup() -> None:
  """Joins a multi-process run (``--distributed``), turns on the compilation cache, and keeps
  absl at WARNING unless ``--verbosity`` is given (orbax logs every checkpoint at INFO)."""
  if not FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)
  launch.setup()
  if FLAGS.jax_cache_dir:
    jax.config.update("jax_compilation_cache_dir", os.path.expanduser(FLAGS.jax_cache_dir))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
