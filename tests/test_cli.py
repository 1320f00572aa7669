"""cmdline.cli: config checks name the field; bad command lines end in one line."""

import subprocess
import sys
import textwrap
from pathlib import Path

import ml_collections
import pytest

from cmdline import cli

ROOT = Path(__file__).resolve().parents[1]


def _config():
  return ml_collections.ConfigDict(
      {"seeds": 2, "methods": "csd,ens15", "method": {"csd": {"lr": 1e-3, "frac": 0.5}}}
  )


def test_check_accepts_a_good_config_and_names_the_bad_field():
  c = _config()
  cli.check(
      c,
      positive=("seeds", "method.csd.lr"),
      unit_interval=("method.csd.frac",),
      subset_of={"methods": ("csd", "ens15", "rnd")},
  )
  c.method.csd.frac = 1.5
  with pytest.raises(cli.ConfigError, match=r"--config\.method\.csd\.frac must be in \[0, 1\]"):
    cli.check(c, unit_interval=("method.csd.frac",))
  c.methods = "csd,nope"
  with pytest.raises(cli.ConfigError, match=r"--config\.methods .* got nope"):
    cli.check(c, subset_of={"methods": ("csd", "ens15")})


def test_split_list_and_to_dict():
  assert cli.split_list("a, b,,c") == ["a", "b", "c"]
  assert cli.split_list(("a", "b")) == ["a", "b"]
  c = ml_collections.ConfigDict({"widths": (64, 64)})
  assert cli.to_dict(c) == {"widths": [64, 64]}


@pytest.fixture(scope="module")
def binary(tmp_path_factory):
  d = tmp_path_factory.mktemp("bin")
  (d / "cfg.py").write_text(textwrap.dedent("""
      import ml_collections
      def get_config(arg=None):
        if arg == "bad":
          raise ValueError("no profile 'bad'")
        return ml_collections.ConfigDict({"steps": 3, "profile": arg or "default"})
      """))
  (d / "prog.py").write_text(textwrap.dedent(f"""
      import sys
      sys.path.insert(0, {str(ROOT)!r})
      from cmdline import cli
      CONFIG = cli.define_config({str(d / 'cfg.py')!r})
      def main(argv):
        cli.check(CONFIG.value, positive=("steps",))
        print("ran", CONFIG.value.steps, CONFIG.value.profile)
      cli.run(main)
      """))
  return d


def _run(binary, *args):
  return subprocess.run(
      [sys.executable, str(binary / "prog.py"), *args], capture_output=True, text=True, timeout=120
  )


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--config.stpes=4"],
            "FATAL Config error: no field 'stpes' in the config (--config.stpes). Did you mean",
        ),
        (
            ["--config.run.steps=4"],
            "FATAL Config error: no field 'run' in the config (--config.run",
        ),
        (["--config.steps=0"], "FATAL Config error: --config.steps must be positive, got 0"),
        (["--no_such_flag"], "FATAL Flags parsing error"),
    ],
)
def test_bad_command_lines_end_in_one_line(binary, args, message):
  proc = _run(binary, *args)
  assert proc.returncode == 1
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith(message), proc.stderr


def test_overrides_and_profiles_reach_main(binary):
  proc = _run(binary, f"--config={binary / 'cfg.py'}:paper", "--config.steps=7")
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout.split() == ["ran", "7", "paper"]


def test_an_error_inside_get_config_ends_in_one_line(binary):
  proc = _run(binary, f"--config={binary / 'cfg.py'}:bad")
  assert proc.returncode == 1
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("FATAL Flags parsing error"), proc.stderr
  assert lines[0].endswith("ValueError: no profile 'bad'"), proc.stderr


def test_reload_config_builds_another_profile_with_the_same_overrides(binary):
  prog = binary / "reload.py"
  prog.write_text(
      (binary / "prog.py")
      .read_text()
      .replace(
          'print("ran", CONFIG.value.steps, CONFIG.value.profile)',
          'c = cli.reload_config("paper")\n  print("ran", c.steps, c.profile, CONFIG.value.profile)',
      )
  )
  for args, expected in (
      [["--config.steps=7"], ["ran", "7", "paper", "default"]],
      [[f"--config={binary / 'cfg.py'}:cpu"], ["ran", "3", "paper", "cpu"]],
  ):
    proc = subprocess.run(
        [sys.executable, str(prog), *args], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == expected
