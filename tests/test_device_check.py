"""benchmarks.device_check on a CPU: the ``dry`` profile end to end (every stage, tiny sizes),
the doom stage's ratios and budget on a stand-in for ``run_cells``, and the binary's flags."""

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import configs.device_check
from benchmarks import device_check

ROOT = Path(__file__).resolve().parents[1]
ENVPOOL = importlib.util.find_spec("envpool") is not None


def test_dry_profile_writes_every_measurement(tmp_path):
  config = configs.device_check.get_config("dry")
  lines = []
  result = device_check.run(config, tmp_path, log=lines.append)
  saved = json.loads((tmp_path / "device_check.json").read_text())
  assert saved["stages"].keys() == result["stages"].keys() == {"csd", "tests", "doom"}
  for key in ("device_kind", "backend", "jax_version", "device_count", "wall_seconds", "config"):
    assert key in saved, key
  assert saved["backend"] == "cpu"
  assert len(lines) == 4 and lines[-1].startswith("wrote ")  # one line per stage, then the file
  for name, stage in saved["stages"].items():
    assert stage["budget_s"] == config[name].budget_s and stage["seconds"] > 0, name

  csd = saved["stages"]["csd"]
  assert csd["ok"], csd.get("traceback")
  assert csd["fit"]["num_steps"] == 3 and csd["fit"]["steps_per_s"] > 0
  assert csd["ens15_train"]["num_members"] == 2 and csd["ens15_train"]["seconds"] > 0
  for name in ("csd_inference", "ens15_inference"):
    assert csd[name]["samples_per_s"] > 0 and csd[name]["rounds_seconds"], name
  assert csd["csd_vs_ens15_inference_speedup"] == pytest.approx(
      csd["csd_inference"]["samples_per_s"] / csd["ens15_inference"]["samples_per_s"]
  )
  assert csd["csd_vs_ens15_train_speedup"] > 0 and csd["query_batch"] == 16

  tests = saved["stages"]["tests"]
  assert tests["ok"], tests.get("output_tail")
  assert (tests["tests"], tests["passed"], tests["failed"], tests["errors"]) == (1, 1, 0, 0)

  doom = saved["stages"]["doom"]
  if not ENVPOOL:
    assert not doom["ok"] and "envpool" in doom["error"]
    return
  assert doom["ok"], doom.get("traceback")
  # the paper's agent in the cpu setting (42x42 gray, 6 frames, 16 envs), learning as it runs
  (row,) = doom["rows"]
  assert row["cell"] == "cpu:csd_sa" and row["sps"] > 0 and row["env_sps"] > 0
  assert row["obs_shape"] == [6, 42, 42] and row["updates"] >= 2
  assert row["ratio_to_setting_dqn"] is None  # no DQN cell of its setting ran
  cell_dir = tmp_path / "doom" / "cpu_csd_sa"  # the cell's own table and plot
  assert json.loads((cell_dir / "doom_throughput.json").read_text())["rows"][0]["sps"] == row["sps"]
  assert (cell_dir / "doom_throughput.png").stat().st_size > 0
  assert saved["ok"]


def _fake_rows(rates: dict, seconds: float = 0.0):
  """A stand-in for ``doom_throughput.run_cells``: the row of its one cell at ``rates[cell]``."""

  def run_cells(config, out_dir, verbose=True):
    del out_dir, verbose
    time.sleep(seconds)
    setting, agent = config.cells.split(":")
    return {
        "rows": [
            dict(
                cell=config.cells,
                setting=setting,
                agent=agent,
                prioritized=True,
                sps=rates[config.cells],
                env_sps=1000.0,
                ratio_to_nature_dqn=1.0,
                steps=config.paper_steps,
            )
        ]
    }

  return run_cells


def test_doom_stage_ratio_to_dqn_and_budget(monkeypatch, tmp_path):
  from benchmarks import doom_throughput

  c = configs.device_check.get_config().doom
  monkeypatch.setattr(
      doom_throughput, "run_cells", _fake_rows({"paper:dqn": 400.0, "paper:csd_sa": 100.0})
  )
  out = device_check.doom_stage(c, 0, device_check.Budget(60), tmp_path)
  assert [r["ratio_to_setting_dqn"] for r in out["rows"]] == [1.0, 0.25]
  assert all("ratio_to_nature_dqn" not in r for r in out["rows"])
  assert out["rows"][0]["steps"] == c.steps and not out["skipped"]
  # A cell starts only while the time left covers the last cell's.
  monkeypatch.setattr(
      doom_throughput,
      "run_cells",
      _fake_rows({"paper:dqn": 400.0, "paper:csd_sa": 100.0}, seconds=0.2),
  )
  with pytest.raises(device_check.StageError, match="paper:csd_sa") as e:
    device_check.doom_stage(c, 0, device_check.Budget(0.3), tmp_path)
  assert [r["cell"] for r in e.value.partial["rows"]] == ["paper:dqn"]
  assert e.value.partial["skipped"] == ["paper:csd_sa"]


def test_junit_counts(tmp_path):
  xml = tmp_path / "junit.xml"
  xml.write_text(
      '<testsuites><testsuite name="pytest" tests="4" failures="1" errors="0" skipped="1">'
      '<testcase classname="tests.test_a" name="test_ok"/>'
      '<testcase classname="tests.test_a" name="test_bad"><failure message="x"/></testcase>'
      '<testcase classname="tests.test_a" name="test_skip"><skipped/></testcase>'
      '<testcase classname="tests.test_b" name="test_ok"/></testsuite></testsuites>'
  )
  assert device_check.junit_counts(xml) == dict(
      tests=4, passed=2, failed=1, errors=0, skipped=1, failing=["tests.test_a::test_bad"]
  )


def test_bad_stage_fails_in_one_line(tmp_path):
  proc = subprocess.run(
      [
          sys.executable,
          "-m",
          "benchmarks.device_check",
          "--config.stages=csd,nope",
          f"--out_dir={tmp_path}",
      ],
      cwd=ROOT,
      capture_output=True,
      text=True,
      timeout=120,
      env=dict(os.environ, JAX_PLATFORMS="cpu"),
  )
  assert proc.returncode == 1
  assert "--config.stages must be a non-empty comma-separated list" in proc.stderr
  assert not (tmp_path / "device_check.json").exists()
