"""Makes neural-tangents 0.6.5 import on current JAX (tested on jax 0.10.x).

neural-tangents 0.6.5 (its last release, Dec 2023) imports names that JAX has since
moved or removed (google/neural-tangents#209). This module re-exposes them at their
old locations, and must run before the first ``import neural_tangents``:

    from csd_jax import _nt_compat  # noqa: F401  (import for its side effect)
    import neural_tangents as nt

Every module of csd_jax that needs neural-tangents imports it through ``nt()`` below,
so the order cannot be got wrong. ``tests/test_nt_compat.py`` fails loudly when a
JAX upgrade moves one of these names again; ``pyproject.toml`` bounds the JAX range.

What is patched (old location -> where the object lives now):

* ``jax.core.{Jaxpr, Var, Literal, Primitive, JaxprEqn}`` -> ``jax.extend.core``
* ``jax.core.{ShapedArray, Value, AbstractValue, eval_context}`` -> ``jax._src.core``
* the module ``jax.util`` (``safe_map``, ``safe_zip``) -> ``jax._src.util``
* ``jax.random.KeyArray`` -> ``jax.Array`` (typed keys are plain arrays now)
* ``jax.interpreters.ad.zeros_like_p``: removed from JAX. neural-tangents only uses it
  as a dictionary key for its structured-derivatives rules, so a placeholder
  ``Primitive`` that no jaxpr ever contains is exactly equivalent.

Also, ``neural_tangents/__init__`` imports ``neural_tangents.experimental``, whose only
content is the TensorFlow port of the empirical NTK; importing it loads TensorFlow
(~8 s and ~1 GB per process). csd_jax never uses it, so unless the environment variable
``CSD_JAX_NT_EXPERIMENTAL=1`` is set, a placeholder module stands in for it and says
how to get the real one when touched.
"""

from __future__ import annotations

import os
import sys
import types

import jax
import jax._src.core as _src_core
import jax._src.util as _src_util
import jax.extend.core as _extend_core
from jax.interpreters import ad as _ad

_FROM_EXTEND = ("Jaxpr", "Var", "Literal", "Primitive", "JaxprEqn")
_FROM_SRC_CORE = ("ShapedArray", "Value", "AbstractValue", "eval_context")

PATCHED: list[str] = []
"""Names this module had to add (empty when JAX still provides them all)."""


def _expose(module: types.ModuleType, name: str, value: object, label: str) -> None:
  if not hasattr(module, name):
    setattr(module, name, value)
    PATCHED.append(label)


class _ExperimentalPlaceholder(types.ModuleType):
  """Stands in for neural_tangents.experimental (TensorFlow-only code)."""

  def __getattr__(self, name: str):
    if name.startswith("__"):
      raise AttributeError(name)
    raise ImportError(
        f"neural_tangents.experimental.{name} is disabled by csd_jax._nt_compat to "
        "avoid importing TensorFlow; set CSD_JAX_NT_EXPERIMENTAL=1 before importing "
        "csd_jax to load it."
    )


def apply() -> None:
  """Installs the re-exports. Idempotent; raises ImportError naming what moved."""
  try:
    for name in _FROM_EXTEND:
      _expose(jax.core, name, getattr(_extend_core, name), f"jax.core.{name}")
    for name in _FROM_SRC_CORE:
      _expose(jax.core, name, getattr(_src_core, name), f"jax.core.{name}")
    if "jax.util" not in sys.modules:
      util = types.ModuleType("jax.util")
      util.safe_map = _src_util.safe_map
      util.safe_zip = _src_util.safe_zip
      sys.modules["jax.util"] = util
      jax.util = util
      PATCHED.append("jax.util")
    _expose(jax.random, "KeyArray", jax.Array, "jax.random.KeyArray")
    _expose(
        _ad,
        "zeros_like_p",
        _extend_core.Primitive("nt_compat_zeros_like"),
        "jax.interpreters.ad.zeros_like_p",
    )
    if (
        os.environ.get("CSD_JAX_NT_EXPERIMENTAL") != "1"
        and "neural_tangents.experimental" not in sys.modules
    ):
      sys.modules["neural_tangents.experimental"] = _ExperimentalPlaceholder(
          "neural_tangents.experimental"
      )
  except AttributeError as e:  # a JAX upgrade moved one of the targets again
    raise ImportError(
        f"csd_jax._nt_compat cannot adapt jax {jax.__version__} for "
        f"neural-tangents 0.6.5: {e}. Use the JAX range pinned in pyproject.toml."
    ) from e


apply()


def nt():
  """Returns the ``neural_tangents`` module, imported after the shim."""
  import neural_tangents  # pylint: disable=g-import-not-at-top

  return neural_tangents
