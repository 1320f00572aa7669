"""The benchmark binaries: documented outputs, and resuming without recomputing finished cells."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from benchmarks import ood
from conftest import simulated_devices_env
from benchmarks import protocol
from configs import ood as ood_config
from cmdline import cli
from uncertainty_kit import data
from uncertainty_kit import defaults

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(module, *args, timeout=600):
  proc = subprocess.run(
      [sys.executable, "-m", module, *args],
      cwd=ROOT,
      capture_output=True,
      text=True,
      timeout=timeout,
  )
  assert proc.returncode == 0, proc.stderr[-4000:]
  return proc


OOD_METHODS = "csd,csd_matched,ens3,ntkgp_exact"


def _ood_config(methods=OOD_METHODS, **fields):
  """configs/ood.py's quick profile (small data, 30 steps per network), one seed, frozen as
  the binary freezes it."""
  config = ood_config.get_config("quick")
  config.methods, config.seeds = methods, 1
  config.update(fields)
  return cli.freeze(config)


def test_ood_config_runs_the_headline_rows_and_the_comparisons_profile_adds_the_rest():
  """The main job runs every method's own row; ``comparisons`` adds the rows comparing CSD with
  its variants, and combines with ``quick``."""
  headline = ood_config.get_config().methods.split(",")
  assert headline == list(defaults.MAIN_METHODS)
  assert not set(headline) & set(defaults.comparison_methods())
  both = ood_config.get_config("quick,comparisons")
  assert both.methods.split(",") == headline + list(defaults.comparison_methods())
  assert both.max_train == ood_config.QUICK_MAX_TRAIN
  with pytest.raises(ValueError, match="unknown profile 'quick,full'"):
    ood_config.get_config("quick,full")


def _hashes(images):
  return {x.tobytes() for x in images}


def _indexed(n, name="set"):
  """n distinct images (image i holds i in its first pixels), labels i mod 10."""
  x = np.zeros((n, 28, 28, 1), np.float32)
  x[:, 0, 0, 0], x[:, 0, 1, 0] = (np.arange(n) % 100) / 100, (np.arange(n) // 100) / 100
  return data.make_dataset(x, np.arange(n) % 10, name)


def _ids(ds):
  return np.round(ds.images[:, 0, 0, 0] * 100).astype(int) + 100 * np.round(
      ds.images[:, 0, 1, 0] * 100
  ).astype(int)


def test_split_ood_parts_are_disjoint_and_cover_the_set():
  ds = _indexed(1001)
  ctx, ev, tu = protocol.split_ood(ds, seed=0)
  parts = [_ids(p) for p in (ctx, ev, tu)]
  assert [len(p) for p in parts] == [400, 400, 201]  # SPLIT_FRACTIONS, remainder to tuning
  assert sorted(np.concatenate(parts)) == list(range(1001))
  assert (ctx.name, ev.name, tu.name) == ("set/context", "set", "set/tune")
  again, other = protocol.split_ood(ds, seed=0), protocol.split_ood(ds, seed=1)
  assert all(np.array_equal(a.images, b.images) for a, b in zip(again, (ctx, ev, tu)))
  assert not np.array_equal(_ids(other[1]), parts[1])
  # fixed tuning indices (a set made image by image from a test set): exactly those
  tune_idx = np.arange(0, 1001, 5)
  ctx, ev, tu = protocol.split_ood(ds, seed=0, tune_indices=tune_idx)
  np.testing.assert_array_equal(_ids(tu), tune_idx)
  rest = np.concatenate([_ids(ctx), _ids(ev)])
  assert sorted(rest) == sorted(set(range(1001)) - set(tune_idx))
  assert abs(len(ctx.labels) - len(ev.labels)) <= 1


@pytest.mark.parametrize("bad", [np.array([0, 1001]), np.array([-1]), np.array([0.5])])
def test_split_ood_rejects_bad_tune_indices(bad):
  with pytest.raises(ValueError, match="tune_indices"):
    protocol.split_ood(_indexed(1001), seed=0, tune_indices=bad)
  with pytest.raises(ValueError, match="tune_indices"):
    protocol.make_task(
        "t",
        _indexed(20),
        _indexed(1001, "test"),
        {"o": _indexed(50, "o")},
        0,
        tune_indices={"absent": np.arange(3)},
    )


def test_make_task_keeps_tuning_apart_from_evaluation():
  test = _indexed(1000, "test")
  derived = test._replace(images=1.0 - test.images, name="test+inverted")  # image i from test i
  other = _indexed(700, "other")
  tune_idx = protocol.split_id_test(test, seed=3)[2]
  task = protocol.make_task(
      "t",
      _indexed(50, "train"),
      test,
      {"inv": derived, "other": other},
      3,
      tune_indices={"inv": tune_idx},
  )
  assert len(task.test.labels) == 800 and len(task.tune.labels) == 200
  assert not set(_ids(task.test)) & set(_ids(task.tune))
  assert sorted(np.concatenate([_ids(task.test), _ids(task.tune)])) == list(range(1000))
  # the derived set's tuning part comes from the ID tuning slice, its other parts from the rest
  inv_ids = lambda ds: _ids(ds._replace(images=1.0 - ds.images))
  assert set(inv_ids(task.ood_tune["inv"])) == set(_ids(task.tune))
  assert not set(inv_ids(task.ood_eval["inv"])) & set(_ids(task.tune))
  assert len(task.context) == 400 + 280  # the context parts of both OOD sets
  for name in ("inv", "other"):
    assert not _hashes(task.ood_tune[name].images) & _hashes(task.ood_eval[name].images)
    assert not _hashes(task.ood_tune[name].images) & _hashes(task.context)
  capped = protocol.make_task("t", _indexed(50), test, {"other": other}, 3, max_test=100)
  assert len(capped.test.labels) == 100 and len(capped.tune.labels) == 50
  assert len(capped.ood_eval["other"].labels) == 100 and len(capped.context) == 100
  assert len(capped.ood_tune["other"].labels) == 50


def test_embedded_tasks_cross_two_families_and_tune_apart():
  tasks = protocol.embedded_tasks(0, max_train=600, max_test=150)
  assert [t.name for t in tasks] == ["mnist5k", "font_letters"]
  digits, letters = tasks
  assert set(digits.ood_eval) == {"sklearn_digits", *data.SHIFTS, "font_letters", "paper_perturbed"}
  assert set(letters.ood_eval) == {"mnist5k", "paper_perturbed"}
  for t in tasks:
    assert set(t.ood_tune) == set(t.ood_eval) and len(t.train.labels) == 600
    evaluated = _hashes(t.test.images) | _hashes(t.context)
    for ds in t.ood_eval.values():
      evaluated |= _hashes(ds.images)
    tuning = _hashes(t.tune.images)
    for ds in t.ood_tune.values():
      tuning |= _hashes(ds.images)
    assert not evaluated & tuning, t.name
  # across tasks: no digit or letter tuned on is evaluated by the other task
  assert not _hashes(digits.tune.images) & _hashes(letters.ood_eval["mnist5k"].images)
  assert not _hashes(letters.tune.images) & _hashes(digits.ood_eval["font_letters"].images)


@pytest.fixture(scope="module")
def ood_run(tmp_path_factory):
  """The binary end to end (command line, config, outputs); the reruns below are in-process."""
  out = tmp_path_factory.mktemp("ood")
  _run(
      "benchmarks.ood",
      "--config=configs/ood.py:quick",
      f"--config.methods={OOD_METHODS}",
      "--config.seeds=1",
      f"--out_dir={out}",
  )
  return out


def test_ood_outputs_have_the_documented_keys(ood_run):
  with open(ood_run / "ood.json") as f:
    summary = json.load(f)
  for key in (
      "results",
      "pairs",
      "seeds",
      "per_pair",
      "tower_comparison",
      "comparisons",
      "protocol",
      "cells",
      "config",
  ):
    assert key in summary, key
  assert summary["seeds"] == 1
  assert len(summary["pairs"]) == 11
  assert sorted(p.split(":")[0] for p in summary["pairs"]) == ["font_letters"] * 2 + ["mnist5k"] * 9
  for name in ("csd", "ens3"):
    r = summary["results"][name]
    for key in (
        "acc",
        "auroc",
        "aupr_in",
        "aupr_out",
        "acc_std",
        "auroc_std",
        "aupr_in_std",
        "aupr_out_std",
        "hparams",
        "score",
        "classifier",
    ):
      assert key in r, (name, key)
    assert 0.0 <= r["auroc"] <= 1.0 and 0.0 <= r["acc"] <= 1.0
    assert "backbone" in r["hparams"] and "train" in r["hparams"]
    assert set(summary["per_pair"][name]) == set(summary["pairs"])
  assert "classifier" in summary["results"]["csd"]["classifier"]
  # the matched form tracks the closed form of its own kernel even after 30 steps; the deep
  # form (default csd) estimates another kernel's variance and is not compared
  assert summary["csd_vs_exact"]["csd_matched"]["spearman"] > 0.6
  assert set(summary["csd_vs_exact"]) == {"csd_matched"}
  # every method also scored by its output's variance (raw, relative), same fitted state
  same = summary["same_functional"]
  assert set(same) == {"csd", "csd_matched", "ens3", "ntkgp_exact"}
  assert same["csd"]["relative"]["auroc"] == summary["results"]["csd"]["auroc"]
  assert same["ens3"]["kinds"] == ["logit_variance", "relative_logit_variance"]
  assert same["ens3"]["default"]["auroc"] == summary["results"]["ens3"]["auroc"]
  for f in same.values():
    assert 0.0 <= f["raw"]["auroc"] <= 1.0 and 0.0 <= f["relative"]["auroc"] <= 1.0
  assert "csd_auroc_ge_ens15_same_functional" not in summary["comparisons"]  # no ens15
  assert summary["comparisons"]["csd_auroc_ge_ntkgp_exact"]["cells"] == 11
  # the full config that ran: the quick profile's budgets, the command line's overrides
  assert summary["config"]["methods"] == OOD_METHODS and summary["config"]["max_train"] == 600
  assert summary["config"]["method"]["csd"]["num_steps"] == ood_config.QUICK_STEPS
  assert summary["results"]["csd"]["hparams"] == summary["config"]["method"]["csd"]
  text = (ood_run / "ood.md").read_text()
  assert "| method | acc | AUROC | AUPR-IN | AUPR-OUT |" in text and "| csd |" in text
  assert "## Every method scored by the variance of its output" in text
  # the command line next to the results, as a flagfile that replays the run, and the config
  flagfile = (ood_run / "ood.flags").read_text().splitlines()
  assert flagfile[0].startswith("# python -m benchmarks.ood")
  assert "--config=configs/ood.py:quick" in flagfile and "--config.seeds=1" in flagfile
  with open(ood_run / "ood.config.json") as f:
    assert json.load(f) == summary["config"]
  for png in ("roc_curves.png", "score_histograms.png", "auroc_by_method.png"):
    assert (ood_run / png).stat().st_size > 1000, png
  assert os.path.isdir(ood_run / "checkpoints" / "csd" / "mnist5k_seed0")


@pytest.mark.slow
def test_ood_resumes_without_recomputing(ood_run):
  cell = ood_run / "cells" / "csd" / "mnist5k_seed0.json"
  before = cell.read_text()
  mtime = cell.stat().st_mtime_ns
  # As after a kill between fitting and scoring: the ens3 cell's result is lost, its checkpoint
  # remains; the csd cell is finished.
  os.remove(ood_run / "cells" / "ens3" / "mnist5k_seed0.json")
  before_pairs = json.loads((ood_run / "ood.json").read_text())["per_pair"]
  summary = ood.run(_ood_config(plots=False), str(ood_run))
  cells = summary["cells"]
  for name, pairs in before_pairs.items():  # the restored state scores as the fitted one
    for pair, m in pairs.items():
      assert summary["per_pair"][name][pair]["auroc"] == pytest.approx(m["auroc"], abs=1e-6)
  assert cells == {
      f"{m}/{t}_seed0": "restored" if (m, t) == ("ens3", "mnist5k") else "loaded"
      for m in ("csd", "csd_matched", "ens3", "ntkgp_exact")
      for t in ("mnist5k", "font_letters")
  }
  assert cell.stat().st_mtime_ns == mtime and cell.read_text() == before
  # A further rerun loads both.
  assert set(ood.run(_ood_config(plots=False), str(ood_run))["cells"].values()) == {"loaded"}


def test_ood_tune_split_scores_the_tuning_parts_with_the_same_fits(ood_run):
  eval_cell = ood_run / "cells" / "csd" / "mnist5k_seed0.json"
  before, summary_before = eval_cell.read_text(), (ood_run / "ood.json").read_text()
  ood.run(_ood_config("csd", split="tune"), str(ood_run))
  with open(ood_run / "ood_tune.json") as f:
    summary = json.load(f)
  # the fits are the eval run's (restored from its checkpoints), scored on the tuning parts
  assert summary["cells"] == {
      "csd/mnist5k_tune_seed0": "restored",
      "csd/font_letters_tune_seed0": "restored",
  }
  assert summary["protocol"]["split"] == "tune" and len(summary["pairs"]) == 11
  with open(ood_run / "cells" / "csd" / "mnist5k_tune_seed0.json") as f:
    record = json.load(f)
  assert record["split"] == "tune" and record["num_test"] == 75  # quick: max_test 150
  assert set(record["num_ood_eval"].values()) == {75}
  assert eval_cell.read_text() == before and (ood_run / "ood.json").read_text() == summary_before
  assert (ood_run / "ood_tune.md").exists() and not (ood_run / "roc_curves_tune.png").exists()


@pytest.mark.slow
def test_throughput_quick(tmp_path):
  _run("benchmarks.throughput", "--config=configs/throughput.py:quick", f"--out_dir={tmp_path}")
  with open(tmp_path / "throughput.json") as f:
    summary = json.load(f)
  for key in (
      "csd_vs_ens15_inference_speedup",
      "csd_vs_ens15_train_speedup",
      "inference",
      "train_seconds",
      "scaling",
  ):
    assert key in summary, key
  for name in ("csd", "ens3", "ens15", "closed_form"):
    assert summary["inference"][name]["samples_per_s"] > 0
  assert (tmp_path / "cost_vs_ensemble_size.png").exists() and (tmp_path / "scaling.png").exists()
  assert summary["config"]["train_steps"] == 20
  assert json.loads((tmp_path / "throughput.config.json").read_text()) == summary["config"]


@pytest.mark.slow  # a benchmark's code path, like test_throughput_quick
def test_deepsea_throughput_quick(tmp_path):
  _run(
      "benchmarks.deepsea_throughput",
      "--config=configs/deepsea_throughput.py:quick",
      f"--out_dir={tmp_path}",
  )
  result = json.loads((tmp_path / "deepsea_throughput.json").read_text())
  rows = {r["first_layer"]: r for r in result["rows"]}
  assert set(rows) == {"dense", "gather"} and all(r["sps"] > 0 for r in rows.values())
  assert rows["dense"]["ratio_to_dense"] == 1.0
  assert rows["gather"]["ratio_to_dense"] == rows["gather"]["sps"] / rows["dense"]["sps"]
  assert (tmp_path / "deepsea_throughput.png").exists()


@pytest.mark.slow  # ~2 min on 2 loaded cores: a third quick OOD run. Faster by default: CSD
# fits agreeing across meshes (test_parallel, test_distributed), mid-fit checkpoints resuming
# (test_checkpoint); the ensemble's and classifier's fits on a mesh are checked only here.
def test_ood_on_a_two_device_mesh_with_mid_fit_checkpoints(ood_run, tmp_path):
  """--mesh=data=2 (simulated CPU devices) and checkpoint_every give the one-device results;
  the mid-fit checkpoints are removed once a cell's fit is saved."""
  env = simulated_devices_env(2)
  proc = subprocess.run(
      [
          sys.executable,
          "-m",
          "benchmarks.ood",
          "--config=configs/ood.py:quick",
          "--config.methods=csd,ens3",
          "--config.seeds=1",
          f"--out_dir={tmp_path}",
          "--mesh=data=2",
          "--config.checkpoint_every=10",
          f"--checkpoint_dir={tmp_path / 'ck'}",
          "--config.plots=False",
      ],
      cwd=ROOT,
      env=env,
      capture_output=True,
      text=True,
      timeout=600,
  )
  assert proc.returncode == 0, proc.stderr[-4000:]
  with open(tmp_path / "ood.json") as f:
    sharded = json.load(f)["per_pair"]
  with open(ood_run / "ood.json") as f:
    single = json.load(f)["per_pair"]
  for name in ("csd", "ens3"):
    for pair, m in single[name].items():
      assert abs(sharded[name][pair]["auroc"] - m["auroc"]) < 5e-3, (name, pair)
  assert (tmp_path / "ck" / "csd" / "mnist5k_seed0").is_dir()  # --checkpoint_dir is used
  assert not (tmp_path / "checkpoints").exists()
  assert not list((tmp_path / "ck").rglob("*.partial"))


@pytest.mark.slow  # ~4 min on 2 loaded cores (compiles); the parts are covered faster: the
# multi-device CSD agreement by test_parallel, the output's figure by the test below
def test_scaling_quick(tmp_path):
  _run(
      "benchmarks.scaling",
      "--config=configs/scaling.py:quick",
      "--config.ns=200",
      "--simulated_devices=2",
      "--device_counts=1,2",
      f"--out_dir={tmp_path}",
  )
  with open(tmp_path / "scaling.json") as f:
    result = json.load(f)
  assert [r["devices"] for r in result["devices"]] == [1, 2] and result["simulated"]
  assert result["devices"][1]["csd_max_rel_diff_vs_1_device"] < 1e-5
  assert result["devices"][1]["csd_steps_per_s"] > 0
  assert result["cost_vs_n"][0]["closed_form_seconds"] > 0
  assert (tmp_path / "scaling.png").stat().st_size > 1000


def test_scaling_plot_takes_the_documented_result(tmp_path):
  """The scaling binary's plot from a result with the keys main writes (test_scaling_quick, slow,
  runs the binary and checks those keys)."""
  from benchmarks import scaling

  result = {
      "platform": "cpu",
      "device_count": 2,
      "simulated": True,
      "devices": [
          {
              "devices": n,
              "csd_steps_per_s": 10.0 * n,
              "csd_examples_per_s": 1e3 * n,
              "classifier_steps_per_s": 20.0 * n,
              "csd_max_rel_diff_vs_1_device": 0.0,
          }
          for n in (1, 2)
      ],
      "cost_vs_n": [
          {"n": 200, "csd_step_seconds": 1e-3, "closed_form_seconds": 0.1},
          {"n": 400, "csd_step_seconds": 1e-3, "closed_form_skipped": "limit"},
      ],
  }
  scaling.plot(result, str(tmp_path / "scaling.png"))
  assert (tmp_path / "scaling.png").stat().st_size > 1000


def test_kernel_ceiling_small_config(tmp_path):
  """In-process, one seed, two kernels, one ridge, the quick profile's data and budget."""
  import configs.kernel_ceiling
  from benchmarks import kernel_ceiling

  config = configs.kernel_ceiling.get_config("quick")
  config.update({"seeds": 1, "ridges": (1e-6,), "layers": "pixels,dense"})
  summary = kernel_ceiling.run(config, str(tmp_path))
  with open(tmp_path / "kernel_ceiling.json") as f:
    assert json.load(f)["auroc"] == summary["auroc"]
  assert set(summary["auroc"]) == {"pixels", "dense"} and len(summary["pairs"]) == 9
  dense = summary["auroc"]["dense"]["1e-06"]
  assert all(0.0 <= dense[p] <= 100.0 for p in summary["pairs"])
  # noise is far outside the span of the digits' pixels; the resized 8x8 digits are not
  assert summary["auroc"]["pixels"]["1e-06"]["uniform_noise"] > 95.0
  assert summary["auroc"]["pixels"]["1e-06"]["sklearn_digits"] < 50.0
  assert "| dense | 1e-06 |" in (tmp_path / "kernel_ceiling.md").read_text()


def test_ood_check_config_names_every_bad_field_of_the_methods_that_run():
  for profile in (None, "quick"):
    ood.check_config(ood_config.get_config(profile))
  config = ood_config.get_config()
  config.methods = "csd,ens3,rnd"
  config.method.csd.num_steps = -1
  config.method.ens3.num_members = 0
  config.method.rnd.train.batch_size = 0
  config.method.rnd.predictor_widths = (256, 0)
  config.method.laplace.train.num_steps = 0  # laplace does not run: not checked
  with pytest.raises(cli.ConfigError) as e:
    ood.check_config(config)
  assert str(e.value).split("; ") == [
      "--config.method.csd.num_steps must be a positive integer, got -1",
      "--config.method.ens3.num_members must be a positive integer, got 0",
      "--config.method.rnd.predictor_widths must hold positive integers, got (256, 0)",
      "--config.method.rnd.train.batch_size must be a positive integer, got 0",
  ]


def test_cost_quality_quick_points_and_dominance(tmp_path):
  from benchmarks import cost_quality
  from configs import cost_quality as cq_config

  config = cq_config.get_config("quick")
  cost_quality.check_config(config)
  out = cost_quality.run(config, str(tmp_path))
  points = out["points"]
  assert set(points) == {"csd@2", "ens1", "ens2"}
  for r in points.values():
    assert 0.0 <= r["auroc"] <= 1.0 and r["fit_seconds"] > 0 and r["num_cells"] > 0
  # dominance is read off the points: a CSD point listed beats the ENS point on both axes
  for ens, better in out["ens_dominated_by"].items():
    for c in better:
      assert points[c]["auroc"] > points[ens]["auroc"]
      assert points[c]["fit_seconds"] < points[ens]["fit_seconds"]
  assert (tmp_path / "cost_quality.png").exists()
  assert json.loads((tmp_path / "cost_quality.json").read_text())["points"] == points
  # each point keeps its own cells (a cell's file name holds no budget), so a rerun loads them
  assert all((tmp_path / "points" / label / "cells").is_dir() for label in points)
  bad = cq_config.get_config("quick")
  bad.csd_steps = (0,)
  with pytest.raises(cli.ConfigError, match="csd_steps"):
    cost_quality.check_config(bad)
