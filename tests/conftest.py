"""Shared pytest fixtures."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import jax  # noqa: E402
import pytest  # noqa: E402

# What the default run asks of XLA:CPU: compile fast, not run fast. LLVM at -O0 without its
# expensive passes, and XLA's older loop emitters instead of the fusion emitters, which take
# longer to compile (docs/results.md, "The default test suite's time").
FAST_COMPILE = (
    "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true "
    "--xla_cpu_use_fusion_emitters=false"
)


def pytest_configure(config):
  """The default run (``-m 'not slow'``) is mostly XLA compiling small programs, not running
  them: ``FAST_COMPILE`` (XLA's CPU fast-math stays off: results agree up to rounding). Set
  before any test starts a backend; their subprocesses inherit it. ``-m slow`` (long numerical
  runs) keeps full optimisation, and so does an XLA_FLAGS that sets a level."""
  flags = os.environ.get("XLA_FLAGS", "")
  if config.getoption("markexpr") == "not slow" and "xla_backend_optimization_level" not in flags:
    os.environ["XLA_FLAGS"] = f"{flags} {FAST_COMPILE}".strip()


@pytest.fixture
def x64():
  """Runs the test with float64 enabled (validation-grade precision)."""
  with jax.enable_x64(True):
    yield
