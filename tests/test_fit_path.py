"""One CSD fit path: the kit's methods, the binaries and users all train through ``csd_jax.fit``;
its checkpoints resume only the run that wrote them; users bring their own flax modules."""

import functools
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from benchmarks import ood_cells
from benchmarks import protocol
import csd_jax
from csd_jax import checkpoint
from csd_jax import csd
from csd_jax import fitting
from csd_jax import models
from uncertainty_kit import data
from uncertainty_kit import defaults
from uncertainty_kit import methods

TINY_CNN = models.CNNSpec(convs=((4, 3, 2),), widths=(16,), out_dim=8)


def _same(a, b):
  for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    np.testing.assert_array_equal(np.asarray(u), np.asarray(v))


@pytest.fixture(scope="module")
def digits():
  mnist = data.mnist5k()
  return data.subset(mnist, np.arange(120))


def _kit_config(**over):
  over = {**defaults.small_budget("csd", 12, batch_size=16), **over}
  over["train"] = {"num_steps": 3, "batch_size": 16}
  return methods.config_for("csd", over)


def test_kit_deep_csd_is_csd_jax_fit(digits):
  """The kit's CSD method and a direct ``csd_jax.fit`` with the same settings: the same params."""
  config = _kit_config(normalize_inputs="pixel")
  key = jax.random.PRNGKey(3)
  state = methods.get("csd").fit(key, digits, config)
  model = methods.csd_model(config)
  assert model.deep and model.input_norm == "pixel"
  k_prior, k_fit = jax.random.split(key)
  x = jnp.asarray(digits.images)
  direct = csd_jax.init(model, k_prior, x)
  direct, _ = csd_jax.fit(model, direct, k_fit, x, verbose=False, **methods.csd_fit_kwargs(config))
  _same(state.arrays["towers"], direct.params)
  _same(
      (state.arrays["input_mean"], state.arrays["input_std"]), (direct.input_mean, direct.input_std)
  )
  # the score is csd_jax.variance of that state on raw images
  q = x[:7]
  np.testing.assert_array_equal(
      np.asarray(methods.get("csd").score(state, q)),
      np.asarray(csd_jax.variance(model, direct, q, relative=True)[0]),
  )


def test_deep_conv_fit_resumes_bitwise(tmp_path, monkeypatch, digits):
  """A deep fit (conv towers, the Python-loop path on CPU) killed after a checkpoint and rerun
  ends bitwise equal to an uninterrupted one."""
  x = jnp.asarray(digits.images)
  model = csd.deep_form(
      TINY_CNN, TINY_CNN, num_steps=12, embed_dim=8, input_norm="global", input_clip=5.0
  )
  state = csd.init(model, jax.random.PRNGKey(0), x)
  fit = functools.partial(
      fitting.fit,
      model,
      state,
      jax.random.PRNGKey(1),
      x,
      num_steps=12,
      batch_size=8,
      augment=_flip,
      extra_fraction=0.5,
      verbose=False,
  )
  ref, _ = fit()
  saves = []
  real_save = checkpoint.Periodic.maybe_save

  def save_then_die(self, step, *a, **k):
    saved = real_save(self, step, *a, **k)
    saves.append(step)
    if step == 8:
      raise KeyboardInterrupt  # a kill right after the step-8 checkpoint
    return saved

  monkeypatch.setattr(checkpoint.Periodic, "maybe_save", save_then_die)
  with pytest.raises(KeyboardInterrupt):
    fit(checkpoint_dir=str(tmp_path), checkpoint_every=4)
  again = []

  def save(self, step, *a, **k):
    again.append(step)
    return real_save(self, step, *a, **k)

  monkeypatch.setattr(checkpoint.Periodic, "maybe_save", save)
  resumed, _ = fit(checkpoint_dir=str(tmp_path), checkpoint_every=4)
  assert saves == [4, 8] and again == [12]  # resumed after step 8, not restarted
  _same(resumed.params, ref.params)
  _same(resumed.opt_state, ref.opt_state)


def _flip(key, c):
  del key
  return c[:, :, ::-1]


def test_two_learning_rates_never_share_a_checkpoint(tmp_path):
  """``optax.adam(1e-3)`` and ``adam(1e-4)`` differ in the fit's identity: the second run stops
  in one line naming the optimizer instead of resuming the first one's state."""
  x = jax.random.normal(jax.random.PRNGKey(0), (40, 3))
  mlp = models.MLPSpec(widths=(16,))
  for lr in (1e-3, 1e-4):
    model = csd.CSD(prior=mlp, feature_net=mlp, optimizer=optax.adam(lr))
    state = csd.init(model, jax.random.PRNGKey(1), x)
    run = functools.partial(
        fitting.fit,
        model,
        state,
        jax.random.PRNGKey(2),
        x,
        num_steps=10,
        batch_size=8,
        checkpoint_dir=str(tmp_path),
        verbose=False,
    )
    if lr == 1e-3:
      run()
      continue
    with pytest.raises(checkpoint.IdentityMismatchError) as err:
      run()
    message = str(err.value)
    assert "\n" not in message and "model.optimizer" in message
    assert "model.prior" not in message  # only what differs is named


def test_describe_sees_an_optimizers_hyper_parameters():
  d = checkpoint.describe
  assert d(optax.adam(1e-3)) == d(optax.adam(1e-3))
  assert d(optax.adam(1e-3)) != d(optax.adam(1e-4))
  assert d(optax.adam(optax.linear_schedule(1e-3, 0.0, 100))) != d(
      optax.adam(optax.linear_schedule(1e-3, 0.0, 200))
  )
  assert "0x" not in d(optax.adam(1e-3))


def _tiny_task(context_start: int) -> protocol.Task:
  mnist = data.mnist5k()
  train = data.subset(mnist, np.arange(100))
  test = data.subset(mnist, np.arange(100, 140))
  noise = data.shifted(test, ["uniform_noise"], seed=0)["uniform_noise"]
  rows = np.arange(context_start, context_start + 40)
  context = data.shifted(data.subset(mnist, rows), ["rot90"], seed=0)["rot90"].images
  return protocol.Task(
      name="mnist",
      train=train,
      test=test,
      ood_eval={"noise": noise},
      context=context,
      tune=test,
      ood_tune={"noise": noise},
  )


def test_a_changed_context_set_refits_the_cell(tmp_path):
  """The benchmark's cells and fit checkpoints are keyed by config, data and contexts: a rerun
  with other context rows in the same out_dir refits, a rerun with the same ones loads."""
  config = methods.config_for(
      "csd_ood",
      {
          **defaults.small_budget("csd_ood", 4, batch_size=8),
          "train": {"num_steps": 2, "batch_size": 8},
      },
  )
  first = ood_cells.run_cell("csd_ood", config, _tiny_task(140), 0, str(tmp_path))
  assert first["status"] == "computed"
  same = ood_cells.run_cell("csd_ood", config, _tiny_task(140), 0, str(tmp_path))
  assert same["status"] == "loaded"
  other = _tiny_task(180)
  assert not np.array_equal(other.context, _tiny_task(140).context)
  changed = ood_cells.run_cell("csd_ood", config, other, 0, str(tmp_path))
  assert changed["status"] == "computed" and changed["fit_hash"] != first["fit_hash"]


class _Residual(nn.Module):
  """A small residual MLP written here, not one of the project's specs."""

  width: int = 32

  @nn.compact
  def __call__(self, x):
    h = nn.Dense(self.width)(x)
    return h + nn.Dense(self.width)(nn.relu(h))


def test_csd_takes_the_users_own_flax_modules():
  """Any flax module as the prior (its output = ϕ̃) and as the towers (then a linear head)."""
  key = jax.random.PRNGKey(0)
  x = 1.0 + 0.3 * jax.random.normal(key, (300, 4))
  # another direction: the labels are cosines, blind to scale alone
  far = jnp.array([2.0, -2.0, 2.0, -2.0]) + 0.3 * jax.random.normal(jax.random.PRNGKey(1), (50, 4))
  model = csd_jax.deep_form(_Residual(64), _Residual(32), num_steps=400, embed_dim=16)
  state = csd_jax.init(model, jax.random.PRNGKey(2), x)
  assert state.params["feature"]["params"]["head"]["kernel"].shape == (32, 16)
  state, _ = csd_jax.fit(
      model, state, jax.random.PRNGKey(3), x, num_steps=400, batch_size=32, verbose=False
  )
  v_train = csd_jax.variance(model, state, x[:50], relative=True)[0]
  v_far = csd_jax.variance(model, state, far, relative=True)[0]
  assert float(jnp.mean(v_train)) < 0.5 * float(jnp.mean(v_far))
  # the unnormalised form zeroes ψ's head (g₀ ≡ 0) on a module tower too
  plain = csd_jax.CSD(prior=_Residual(64), feature_net=_Residual(), context_net=_Residual())
  zero = csd_jax.init(plain, jax.random.PRNGKey(2), x).params["context"]["params"]["head"]
  assert not any(np.any(np.asarray(v)) for v in jax.tree.leaves(zero))
  with pytest.raises(ValueError, match="last-layer labels only"):
    csd_jax.CSD(prior=_Residual(), feature_net=_Residual(), label_kernel="ntk")
  with pytest.raises(TypeError, match="flax.linen.Module"):
    csd_jax.CSD(prior=lambda x: x)


def test_fit_rejects_a_zero_context_batch():
  x = jax.random.normal(jax.random.PRNGKey(0), (40, 3))
  model = csd.CSD(prior=models.MLPSpec(widths=(8,)))
  state = csd.init(model, jax.random.PRNGKey(1), x)
  with pytest.raises(ValueError, match="context_batch_size must be a positive integer"):
    fitting.fit(
        model, state, jax.random.PRNGKey(2), x, num_steps=5, context_batch_size=0, verbose=False
    )


def test_matched_towers_train_the_loss_they_declare():
  """``fit``'s cached-feature path (matched towers) trains the same loss as ``train_step``."""
  x = jax.random.normal(jax.random.PRNGKey(0), (40, 3))
  model = csd.CSD(prior=models.MLPSpec(widths=(8,)), loss_weighting="diagonal")
  state = csd.init(model, jax.random.PRNGKey(1), x)
  c = x[:8] + 0.1
  phi_x, phi_c = csd.label_features(model, state, x[:8]), csd.label_features(model, state, c)
  np.testing.assert_allclose(
      float(csd.feature_loss(model, state.params, phi_x, phi_c)),
      float(csd.loss(model, state, state.params, x[:8], c)),
      rtol=1e-5,
  )


def test_augment_and_context_together_replace_at_the_given_rate():
  """With both an augmentation and a context set, a context row is replaced with probability
  ``extra_fraction`` in all (half each kind), not 1 − (1 − p)²."""
  x = jnp.zeros((64, 2))
  extra = jnp.full((16, 2), 2.0)
  mark = lambda key, c: c + 1.0  # augmented rows hold 1, extra rows 2, kept rows 0
  model = csd.CSD(prior=models.MLPSpec(widths=(4,)), loss_weighting="diagonal")
  rows = []
  for i in range(200):
    _, c = csd.sample_batch(model, jax.random.PRNGKey(i), x, extra, mark, 64, 64, 0.4)
    rows.append(np.asarray(c[:, 0]))
  rows = np.concatenate(rows)
  assert abs(np.mean(rows != 0) - 0.4) < 0.01
  assert abs(np.mean(rows == 1) - 0.2) < 0.01 and abs(np.mean(rows == 2) - 0.2) < 0.01


def test_readme_quick_start_runs_and_ranks_training_data_below_queries():
  """The README's quick start, run as written but for its step count (300 of its 1,200, to keep
  the suite short): the training set's variance is below the queries' (it runs the benchmark's
  deep estimator with ``deep_form``'s other defaults)."""
  text = open("README.md").read()
  block = re.search(r"## Quick start.*?```python\n(.*?)```", text, re.S).group(1)
  assert "csd_jax.deep_form(" in block and block.count("num_steps=1200") == 1
  block = block.replace("num_steps=1200", "num_steps=300")
  scope: dict = {}
  exec(compile(block, "README.md", "exec"), scope)  # noqa: S102  (the documented example)
  model, state = scope["model"], scope["state"]
  assert model == scope["model"] and model.deep
  v_train = csd_jax.variance(model, state, scope["x_train"][:100])[0]
  assert float(jnp.mean(v_train)) < float(jnp.mean(scope["var"]))
  # the bring-your-own-network example builds a model of the user's module
  own = re.search(r"\*\*Your own network\.\*\*.*?```python\n(.*?)```", text, re.S).group(1)
  exec(compile(own, "README.md", "exec"), scope)  # noqa: S102
  assert scope["model"].deep and not models.is_spec(scope["model"].prior)


def test_relative_variance_of_free_towers_skips_the_prior():
  """1 − cos needs the towers only: the same numbers as V/k(x,x) through the prior, and a
  jitted score whose program holds no prior convolution."""
  x = jax.random.uniform(jax.random.PRNGKey(0), (32, 12, 12, 1))
  model = csd.deep_form(TINY_CNN, TINY_CNN, num_steps=5, embed_dim=8)
  state = csd.init(model, jax.random.PRNGKey(1), x)
  state, _ = fitting.fit(
      model, state, jax.random.PRNGKey(2), x, num_steps=5, batch_size=8, verbose=False
  )
  rel = csd.variance(model, state, x, relative=True)[0]
  full = csd.variance(model, state, x)[0] / csd.prior_variance(model, state.prior_params, x)
  np.testing.assert_allclose(rel, full, rtol=1e-4, atol=1e-6)
  phi, psi = csd.tower_outputs(model, state, x)
  cos = jnp.sum(phi * psi, -1) / (jnp.linalg.norm(phi, axis=-1) * jnp.linalg.norm(psi, axis=-1))
  np.testing.assert_allclose(rel, 1.0 - cos, rtol=1e-4, atol=1e-6)
  convs = (
      lambda rel: jax.jit(lambda s, q: csd.variance(model, s, q, relative=rel)[0])
      .lower(state, x)
      .as_text()
      .count("convolution(")
  )
  assert convs(True) == 2 * convs(False) // 3  # two towers' convolutions of the three nets'


def test_csd_diagnostics_quick(tmp_path):
  from benchmarks import csd_diagnostics
  from configs import csd_diagnostics as diag_config

  out = csd_diagnostics.run(diag_config.get_config("quick"), str(tmp_path))
  digits = out["tasks"]["mnist5k"]
  assert {"train", "id", "sklearn_digits"} <= set(digits)
  for name, s in digits.items():
    assert len(s["score_histogram"]) == 40 and sum(s["score_histogram"]) > 0
    q = s["quantiles"]
    assert q["prior_nearest_cos"][-1] <= 1.0 + 1e-5 and min(q["norm_phi"]) > 0
    assert (s["auroc"] is None) == (name in ("train", "id"))
  # a training input's nearest training input is itself
  assert digits["train"]["quantiles"]["prior_nearest_cos"][0] > 1.0 - 1e-4
  assert (tmp_path / "csd_diagnostics.png").exists()
