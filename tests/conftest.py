"""Shared pytest fixtures."""

import os
import subprocess
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import jax  # noqa: E402
import pytest  # noqa: E402

# What the default run asks of XLA:CPU: compile fast, not run fast. LLVM at -O0 without its
# expensive passes, and XLA's older loop emitters instead of the fusion emitters, which take
# longer to compile (docs/results.md, "The default test suite's time").
FAST_COMPILE = (
    "--xla_backend_optimization_level=0",
    "--xla_llvm_disable_expensive_passes=true",
    "--xla_cpu_use_fusion_emitters=false",
)


def _xla_starts_with(flags: str) -> bool:
  """Whether a CPU backend starts with ``flags`` in XLA_FLAGS: XLA exits on a flag it does not
  know (status 1, silently under TF_CPP_MIN_LOG_LEVEL=3), and its releases retire CPU flags."""
  env = dict(os.environ, XLA_FLAGS=flags, JAX_PLATFORMS="cpu")
  probe = [sys.executable, "-c", "import jax.numpy as jnp; jnp.zeros(1).block_until_ready()"]
  return subprocess.run(probe, env=env, capture_output=True).returncode == 0


def fast_compile_flags() -> str:
  """``FAST_COMPILE``, less the flags this jaxlib's XLA does not know."""
  if _xla_starts_with(" ".join(FAST_COMPILE)):
    return " ".join(FAST_COMPILE)
  return " ".join(f for f in FAST_COMPILE if _xla_starts_with(f))


def pytest_configure(config):
  """The default run (``-m 'not slow'``) is mostly XLA compiling small programs, not running
  them: ``FAST_COMPILE`` (XLA's CPU fast-math stays off: results agree up to rounding). Set
  before any test starts a backend; their subprocesses (and xdist's workers) inherit it.
  ``-m slow`` (long numerical runs) keeps full optimisation, and so does an XLA_FLAGS that sets
  a level."""
  flags = os.environ.get("XLA_FLAGS", "")
  if config.getoption("markexpr") == "not slow" and "xla_backend_optimization_level" not in flags:
    os.environ["XLA_FLAGS"] = f"{flags} {fast_compile_flags()}".strip()


@pytest.fixture
def x64():
  """Runs the test with float64 enabled (validation-grade precision)."""
  with jax.enable_x64(True):
    yield


def simulated_devices_env(count: int) -> dict:
  """The environment of a subprocess that sees ``count`` simulated CPU devices, keeping this
  run's XLA_FLAGS (``FAST_COMPILE`` in the default run: without it the subprocess compiles
  at full optimisation)."""
  flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={count}"
  return dict(os.environ, XLA_FLAGS=flags.strip(), JAX_PLATFORMS="cpu")


def run_python(*args: str, timeout: float = 300, **env: str) -> subprocess.CompletedProcess:
  """``python ARGS`` in the repository root on JAX's CPU backend (``env``: environment variables
  to set), its output captured as text; fails the test with its stderr's tail unless it exits 0."""
  proc = subprocess.run(
      [sys.executable, *args],
      cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
      env=dict(os.environ, JAX_PLATFORMS="cpu", **env),
      capture_output=True,
      text=True,
      timeout=timeout,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  return proc
