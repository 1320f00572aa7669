"""Shared pytest fixtures."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import jax  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture
def x64():
  """Runs the test with float64 enabled (validation-grade precision)."""
  with jax.enable_x64(True):
    yield
