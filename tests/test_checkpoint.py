"""Checkpointed fits: resumable after SIGKILL (bitwise on CPU), chunk-independent, fail-safe."""

import functools
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from csd_jax import checkpoint
from csd_jax import csd
from csd_jax import fitting
from csd_jax import models
from uncertainty_kit import train

ROOT = Path(__file__).resolve().parents[1]

# A CSD fit and a 3-member ensemble fit, both checkpointed under argv[1]; final params to argv[2].
_FIT_SCRIPT = textwrap.dedent("""
    import sys
    import jax, numpy as np
    from csd_jax import csd, fitting, models
    from uncertainty_kit import train
    ckpt_dir, out = sys.argv[1], sys.argv[2]
    x = jax.random.normal(jax.random.PRNGKey(0), (256, 6))
    tower = models.MLPSpec(widths=(64,))
    model = csd.CSD(prior=models.MLPSpec(widths=(128,)), feature_net=tower, context_net=tower,
                    embed_dim=16)
    state = csd.init(model, jax.random.PRNGKey(1), x)
    state, _ = fitting.fit(model, state, jax.random.PRNGKey(2), x, num_steps=3000, batch_size=64,
                       log_every=1000, checkpoint_dir=ckpt_dir + "/csd", checkpoint_every=100,
                       verbose=False)
    images = jax.random.uniform(jax.random.PRNGKey(3), (128, 8, 8, 1))
    labels = jax.random.randint(jax.random.PRNGKey(4), (128,), 0, 3)
    spec = models.CNNSpec(convs=((4, 3, 2),), widths=(16,), out_dim=3)
    ens, _ = train.train_ensemble(
        jax.random.PRNGKey(5), spec, images, labels, num_members=3, num_steps=150, batch_size=16,
        lr=1e-2, mode="sequential",
        run=train.RunOptions(checkpoint_dir=ckpt_dir + "/ens", checkpoint_every=10))
    leaves = jax.tree.leaves((state.params, ens))
    np.savez(out, *[np.asarray(v) for v in leaves])
    print("DONE")
""")


def _wait_for(pred, proc, timeout=300.0) -> None:
  deadline = time.time() + timeout
  while time.time() < deadline and proc.poll() is None and not pred():
    time.sleep(0.02)


def _has_step(folder: Path) -> bool:
  return folder.is_dir() and any(p.name.isdigit() for p in folder.iterdir())


# ~2 min on 2 cores (four processes each compiling two fits). Bitwise resumption from a
# checkpoint is covered by default in-process below (fitting.fit, train.fit_loop), a corrupted last
# checkpoint by test_corrupted_periodic_checkpoint_falls_back_with_a_warning, and a SIGKILL of a
# binary by tests/test_rl_drivers.py::test_sigkilled_binary_resumes_to_bitwise_identical_params.
@pytest.mark.slow
def test_sigkilled_fits_resume_to_bitwise_identical_params(tmp_path):
  """A CSD fit and an ensemble fit, SIGKILLed at a random moment after a checkpoint (once in
  each), rerun with the same arguments: final params equal an uninterrupted run's, bit for bit."""
  script = tmp_path / "fit.py"
  script.write_text(_FIT_SCRIPT)
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))

  def start(name, ckpt):
    return subprocess.Popen(
        [sys.executable, str(script), str(ckpt), str(tmp_path / name)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )

  reference = start("ref.npz", tmp_path / "ref_ckpt")
  ckpt = tmp_path / "ckpt"
  rng = random.Random()
  for ready in (lambda: _has_step(ckpt / "csd"), lambda: _has_step(ckpt / "ens" / "member_001")):
    victim = start("victim.npz", ckpt)
    _wait_for(ready, victim)
    time.sleep(rng.uniform(0.0, 0.3))
    assert victim.poll() is None, "the fit ended before it could be killed: make it longer"
    victim.send_signal(signal.SIGKILL)
    victim.wait()
  assert _has_step(ckpt / "ens" / "member_000")  # the second kill came after member 0
  final = start("resumed.npz", ckpt)
  out, err = final.communicate(timeout=600)
  assert final.returncode == 0 and "DONE" in out, err[-3000:]
  out, err = reference.communicate(timeout=600)
  assert reference.returncode == 0, err[-3000:]
  a, b = np.load(tmp_path / "resumed.npz"), np.load(tmp_path / "ref.npz")
  assert a.files == b.files and len(a.files) > 4
  for k in a.files:
    np.testing.assert_array_equal(a[k], b[k])


def _tiny_csd():
  x = jax.random.normal(jax.random.PRNGKey(0), (40, 3))
  model = csd.CSD(prior=models.MLPSpec(widths=(32,)))
  return model, csd.init(model, jax.random.PRNGKey(1), x), x


def test_csd_fit_does_not_depend_on_chunking():
  """Step t's key depends on t only: log/checkpoint boundaries do not change the result."""
  model, state, x = _tiny_csd()
  fit = functools.partial(
      fitting.fit, model, state, jax.random.PRNGKey(2), x, num_steps=60, batch_size=8, verbose=False
  )
  a, _ = fit(log_every=60)
  b, _ = fit(log_every=7)
  for u, v in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params), strict=True):
    np.testing.assert_array_equal(np.asarray(u), np.asarray(v))


def test_csd_fit_resumes_and_refuses_another_configuration(tmp_path):
  model, state, x = _tiny_csd()
  fit = functools.partial(
      fitting.fit,
      model,
      state,
      jax.random.PRNGKey(2),
      x,
      batch_size=8,
      checkpoint_dir=str(tmp_path),
      checkpoint_every=10,
      verbose=False,
  )
  short, _ = fit(num_steps=60)
  long_ref, _ = fitting.fit(
      model, state, jax.random.PRNGKey(2), x, num_steps=60, batch_size=8, verbose=False
  )
  for u, v in zip(jax.tree.leaves(short.params), jax.tree.leaves(long_ref.params), strict=True):
    np.testing.assert_array_equal(np.asarray(u), np.asarray(v))
  again, hist = fit(num_steps=60)  # everything is checkpointed: nothing left to do
  assert hist["step"] == [60]
  with pytest.raises(ValueError, match="written by a run with other"):
    fit(num_steps=60, extra_fraction=0.25)


def test_corrupted_periodic_checkpoint_falls_back_with_a_warning(tmp_path, capsys):
  ckpt = checkpoint.Periodic(tmp_path / "c", every=5, identity={"run": 1})
  tree = {"w": jnp.arange(4.0)}
  for step in (5, 10):
    ckpt.maybe_save(step, {"w": tree["w"] + step}, num_steps=20)
  ckpt.close()
  for f in (tmp_path / "c" / "10").rglob("*"):
    if f.is_file():
      f.write_bytes(f.read_bytes()[: len(f.read_bytes()) // 2])
  again = checkpoint.Periodic(tmp_path / "c", every=5, identity={"run": 1})
  restored, step, _ = again.restore(tree)
  assert step == 5
  np.testing.assert_array_equal(np.asarray(restored["w"]), np.arange(4.0) + 5)
  assert "checkpoint 10" in capsys.readouterr().err
  assert (tmp_path / "corrupt_checkpoints" / "10").is_dir()


class _Saved(NamedTuple):
  a: jax.Array
  b: tuple


class _Now(NamedTuple):  # _Saved with a field added since, None in this run
  a: jax.Array
  b: tuple
  extra: Any = None


def test_a_state_with_an_added_none_field_restores_an_older_checkpoint(tmp_path):
  """orbax refuses the tree (its structure has the new empty node); the arrays are restored by
  path. A checkpoint that lacks an array the state has is still refused, and left in place."""
  saved = _Saved(jnp.arange(3.0), (jnp.ones((2, 2), jnp.int32), {"c": jnp.zeros(4)}))
  mngr = checkpoint.manager(tmp_path / "ck")
  checkpoint.save(mngr, 7, {"state": saved}, {"note": "old"})
  now = {"state": _Now(jnp.zeros(3), (jnp.zeros((2, 2), jnp.int32), {"c": jnp.ones(4)}))}
  tree, meta = checkpoint.restore_latest(mngr, now)
  assert isinstance(tree["state"], _Now) and tree["state"].extra is None and meta["note"] == "old"
  for x, y in zip(jax.tree.leaves(tree), jax.tree.leaves({"state": saved})):
    np.testing.assert_array_equal(x, y)
  other = checkpoint.manager(tmp_path / "other")
  checkpoint.save(other, 1, {"state": saved}, {})
  more = {
      "state": _Now(jnp.zeros(3), (jnp.zeros((2, 2), jnp.int32), {"c": jnp.ones(4)}), jnp.ones(2))
  }
  with pytest.raises(checkpoint.StateMismatchError, match="holds 3 arrays, the state 4"):
    checkpoint.restore_latest(other, more)
  assert other.all_steps() == [1] and not (tmp_path / "corrupt_checkpoints").exists()
  tree, _ = checkpoint.restore_latest(other, {"state": _Now(*saved)})  # still readable
  np.testing.assert_array_equal(tree["state"].a, saved.a)


@pytest.mark.parametrize("w", [jnp.zeros(5), jnp.zeros(4, jnp.int32)], ids=["shape", "dtype"])
def test_a_checkpoint_of_another_shape_or_dtype_is_refused_and_left_in_place(tmp_path, w):
  """Same tree, one array differs: orbax alone fails on the shape as on damage and casts the
  dtype silently; both are refused from the checkpoint's metadata before any restore."""
  mngr = checkpoint.manager(tmp_path / "ck")
  checkpoint.save(mngr, 3, {"w": jnp.arange(4.0), "b": jnp.ones(2)}, {})
  with pytest.raises(checkpoint.StateMismatchError, match=r"\['w'\] is float32\[4\]"):
    checkpoint.restore_latest(mngr, {"w": w, "b": jnp.zeros(2)})
  assert mngr.all_steps() == [3] and not (tmp_path / "corrupt_checkpoints").exists()
  tree, _ = checkpoint.restore_latest(mngr, {"w": jnp.zeros(4), "b": jnp.zeros(2)})
  np.testing.assert_array_equal(tree["w"], np.arange(4.0))


def test_classifier_resume_in_process(tmp_path):
  """train_classifier: a run that stopped at a checkpoint continues to the same params."""
  images = jax.random.uniform(jax.random.PRNGKey(0), (64, 8, 8, 1))
  labels = jax.random.randint(jax.random.PRNGKey(1), (64,), 0, 3)
  spec = models.CNNSpec(convs=((4, 3, 2),), widths=(8,), out_dim=3)
  kw = dict(num_steps=20, batch_size=8, lr=1e-2)
  ref, _ = train.train_classifier(jax.random.PRNGKey(2), spec, images, labels, **kw)
  run = train.RunOptions(checkpoint_dir=str(tmp_path), checkpoint_every=5)
  # a stopped run: its checkpoints hold steps 10 and 15 (max_to_keep=2), not the final 20
  init, step, _, _ = train._classifier_fns(spec, 1e-2, 0.0, 20, 8)
  k_init, k_loop = jax.random.split(jax.random.PRNGKey(2))
  carry = (*init(k_init, images[:1]), images, labels)
  keys = jax.random.split(k_loop, 20)
  identity = dict(
      kind="classifier",
      spec=train.spec_to_config(spec),
      key=checkpoint.key_id(jax.random.PRNGKey(2)),
      data=checkpoint.fingerprint(images, labels),
      num_steps=20,
      batch_size=8,
      lr=1e-2,
      weight_decay=0.0,
  )
  train.fit_loop(step, carry, keys[:15], run.periodic(lambda: identity))
  resumed, _ = train.train_classifier(jax.random.PRNGKey(2), spec, images, labels, run=run, **kw)
  for u, v in zip(jax.tree.leaves(resumed), jax.tree.leaves(ref), strict=True):
    np.testing.assert_array_equal(np.asarray(u), np.asarray(v))


def test_describe_is_stable_across_processes():
  def f(a, b=2):
    return a + b

  text = checkpoint.describe(functools.partial(f, b=3))
  assert "0x" not in text and "b=3" in text
