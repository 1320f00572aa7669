"""The library (`csd_jax`) stands alone: its public surface and what it does not import; the
config files (`configs/`) are plain data that load neither the library nor JAX."""

import ast
import subprocess
import sys
from pathlib import Path

import csd_jax

ROOT = Path(__file__).resolve().parents[1]
# Binary and benchmark-kit dependencies: the library's own code imports none of them.
NOT_IN_LIBRARY = (
    "absl",
    "tensorflow",
    "tensorflow_datasets",
    "matplotlib",
    "tqdm",
    "ml_collections",
    "sklearn",
    "uncertainty_kit",
    "cmdline",
    "benchmarks",
    "validation",
    "rl",
)


def _imported_roots(path: Path) -> set[str]:
  roots = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Import):
      roots.update(a.name.split(".")[0] for a in node.names)
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
      roots.add(node.module.split(".")[0])
  return roots


def test_library_source_imports_no_binary_dependency():
  offenders = {
      p.name: sorted(_imported_roots(p) & set(NOT_IN_LIBRARY))
      for p in sorted((ROOT / "csd_jax").glob("*.py"))
  }
  assert not {k: v for k, v in offenders.items() if v}, offenders


def test_importing_the_library_loads_no_plotting_data_or_progress_package():
  code = (
      "import sys, csd_jax; print(','.join(sorted({m.split('.')[0] for m in sys.modules} & "
      f"{set(NOT_IN_LIBRARY) - {'absl'}!r})))"
  )  # absl comes in through chex and orbax
  out = subprocess.run(
      [sys.executable, "-c", code],
      capture_output=True,
      text=True,
      check=True,
      cwd=ROOT,
      timeout=300,
  )
  assert out.stdout.strip() == ""


# JAX and the code built on it: a config file loads none of them.
NOT_IN_CONFIGS = ("jax", "flax", "optax", "csd_jax")


def test_config_files_load_no_jax():
  """Every ``configs/*.py`` imported and its default profile built, in a fresh interpreter."""
  code = (
      "import importlib, pathlib, sys\n"
      "for p in sorted(pathlib.Path('configs').glob('[!_]*.py')):\n"
      "  importlib.import_module('configs.' + p.stem).get_config()\n"
      "print(','.join(sorted({m.split('.')[0] for m in sys.modules} & "
      f"{set(NOT_IN_CONFIGS)!r})))"
  )
  out = subprocess.run(
      [sys.executable, "-c", code],
      capture_output=True,
      text=True,
      check=True,
      cwd=ROOT,
      timeout=300,
  )
  assert out.stdout.strip() == ""
  assert len(list((ROOT / "configs").glob("[!_]*.py"))) > 10  # the glob found the config files


def test_public_names_resolve():
  for name in csd_jax.__all__:
    assert getattr(csd_jax, name) is not None, name
  assert csd_jax.fit is csd_jax.fitting.fit and csd_jax.CSD is csd_jax.csd.CSD
