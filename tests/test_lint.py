"""Static checks of the whole tree: pyflakes, the one format (pyink), and module boundaries.

Some code paths only run in long binary runs, where a misspelt name would surface after
minutes; pyflakes finds it at once. A module that reaches into another module's private name
(``from m import _f`` or ``m._f``) couples to what that module may change without notice.
"""

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("csd_jax", "uncertainty_kit", "cmdline", "rl", "benchmarks", "validation", "configs")


def _run(*args: str) -> subprocess.CompletedProcess:
  return subprocess.run(
      [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=300
  )


def test_pyflakes_finds_nothing():
  proc = _run("pyflakes", *PACKAGES, "tests")
  assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_tree_is_pyink_formatted():
  proc = _run("pyink", "--check", "--quiet", ".")
  assert proc.returncode == 0, "run `pyink .`:\n" + proc.stdout + proc.stderr


def _private(name: str) -> bool:
  return name.startswith("_") and not name.startswith("__")


def private_uses(path: Path) -> list[str]:
  """``from m import _f`` and ``m._f`` in ``path``, where ``m`` is another of the project's
  modules; a package's own private modules (``csd_jax._nt_compat`` inside ``csd_jax``) are its
  business."""
  package = path.relative_to(ROOT).parts[0]
  tree = ast.parse(path.read_text())
  modules, found = set(), []
  for node in ast.walk(tree):
    if isinstance(node, ast.ImportFrom) and node.module:
      top = node.module.split(".")[0]
      if top not in PACKAGES:
        continue
      for alias in node.names:
        if _private(alias.name) and top != package:
          found.append(f"{path.name}:{node.lineno}: from {node.module} import {alias.name}")
        elif not _private(alias.name):
          modules.add(alias.asname or alias.name)
    elif isinstance(node, ast.Import):
      modules.update(
          a.asname or a.name.split(".")[0] for a in node.names if a.name.split(".")[0] in PACKAGES
      )
  for node in ast.walk(tree):
    if (
        isinstance(node, ast.Attribute)
        and _private(node.attr)
        and isinstance(node.value, ast.Name)
        and node.value.id in modules
    ):
      found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value.id}.{node.attr}")
  return found


def test_private_use_check_sees_both_forms(tmp_path, monkeypatch):
  monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
  (tmp_path / "rl").mkdir()
  bad = tmp_path / "rl" / "bad.py"
  bad.write_text("from csd_jax import _nt_compat\nfrom csd_jax import csd\ncsd._unit(1)\n")
  assert len(private_uses(bad)) == 2


def test_no_module_uses_another_modules_private_names():
  found = [
      use for pkg in PACKAGES for f in sorted((ROOT / pkg).rglob("*.py")) for use in private_uses(f)
  ]
  assert not found, "\n".join(found)
