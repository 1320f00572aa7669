"""Shared pytest fixtures."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# Most of the suite's time is XLA compiling small programs, not running them: LLVM at -O0 halves
# it (the numerics are the same: XLA's CPU fast-math stays off). Set before jax starts a backend;
# the tests' subprocesses inherit it. An XLA_FLAGS that sets the level already is left alone.
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = " ".join(
      f for f in (os.environ.get("XLA_FLAGS", ""), "--xla_backend_optimization_level=0") if f)

import jax  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture
def x64():
  """Runs the test with float64 enabled (validation-grade precision)."""
  with jax.enable_x64(True):
    yield
