"""The neural-tangents shim: imports on this JAX and gives known kernel values."""

import math
import subprocess
import sys

import jax.numpy as jnp
import numpy as np

from csd_jax import _nt_compat


def test_shim_makes_neural_tangents_import():
  nt = _nt_compat.nt()
  assert hasattr(nt, "empirical_ntk_fn") and hasattr(nt.predict, "gp_inference")


def test_shim_keeps_tensorflow_out_of_the_process():
  """Checked in a fresh interpreter: other tests (tfds) import TensorFlow into this one."""
  code = (
      "import sys; from csd_jax import _nt_compat; nt = _nt_compat.nt(); "
      "nt.stax.serial(nt.stax.Dense(1)); print('tensorflow' in sys.modules)"
  )
  proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert proc.stdout.strip() == "False"


def test_every_patched_name_resolves():
  import jax

  for label in _nt_compat.PATCHED:
    obj = jax
    for part in label.split(".")[1:]:
      obj = getattr(obj, part)  # raises if the shim lost one
    assert obj is not None


def test_known_kernel_value(x64):
  """One ReLU layer, NTK parameterisation: closed form by hand (arc-cosine, order 1)."""
  stax = _nt_compat.nt().stax
  _, _, kernel_fn = stax.serial(
      stax.Dense(1, W_std=1.0, b_std=None), stax.Relu(), stax.Dense(1, W_std=1.0, b_std=None)
  )
  x = jnp.array([[1.0, 0.0], [0.0, 1.0]])  # orthogonal unit vectors
  k = kernel_fn(x, None, ("nngp", "ntk"))
  # Layer 1 (fan-in 2): K1 = x·y / 2, so 1/2 on the diagonal, 0 off it (angle t = π/2).
  # ReLU: E[relu(u) relu(v)] = √(K1(x,x)K1(y,y))/(2π) (sin t + (π − t) cos t),
  # derivative kernel (π − t)/(2π). Readout: Σ2 = that; Θ2 = Σ2 + K1 · (π − t)/(2π).
  np.testing.assert_allclose(k.nngp[0, 1], 1 / (4 * math.pi), rtol=1e-12)  # (1/2)/(2π)
  np.testing.assert_allclose(k.ntk[0, 1], 1 / (4 * math.pi), rtol=1e-12)  # + 0 · 1/4
  np.testing.assert_allclose(np.diag(k.nngp), 0.25, rtol=1e-12)  # (1/2)/2
  np.testing.assert_allclose(np.diag(k.ntk), 0.5, rtol=1e-12)  # 1/4 + 1/2 · 1/2


def test_experimental_placeholder_explains_itself():
  import pytest
  import neural_tangents

  with pytest.raises(ImportError, match="CSD_JAX_NT_EXPERIMENTAL"):
    neural_tangents.experimental.empirical_ntk_fn_tf  # noqa: B018
