"""Every method of the registry fits, scores and predicts on a tiny embedded subset."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cmdline import cli
from csd_jax import checkpoint
from csd_jax import csd
from uncertainty_kit import augment
from uncertainty_kit import data
from uncertainty_kit import defaults
from uncertainty_kit import methods
from uncertainty_kit import metrics
from uncertainty_kit import scores
from uncertainty_kit import train
from uncertainty_kit.baselines import sgld
from uncertainty_kit.interface import MethodState


@pytest.fixture(scope="module")
def tiny():
  """400 training digits, 100 test digits, 100 uniform-noise images, a small OOD context."""
  mnist = data.mnist5k()
  rng = np.random.default_rng(0)
  idx = rng.permutation(len(mnist.labels))
  train_ds = data.subset(mnist, idx[:400])
  test_ds = data.subset(mnist, idx[400:500])
  noise = data.shifted(test_ds, ["uniform_noise"], seed=0)["uniform_noise"]
  # CSD-OOD's context: another shift (rotated digits), as in the benchmark, where the context
  # half of each OOD set is disjoint from the evaluated half.
  context = data.shifted(data.subset(mnist, idx[500:600]), ["rot90"], seed=1)["rot90"].images
  return train_ds, test_ds, noise, context


def _tiny_config(name):
  return methods.config_for(name, defaults.small_budget(name, TINY_STEPS))


# Steps per network: enough for every method to tell digits from noise and to classify well
# above chance; the fits are shared by the tests below (one per method).
TINY_STEPS = 100
_FITS: dict = {}


def _fitted(tiny, name):
  """The method's state fitted on ``tiny`` with ``_tiny_config`` (fitted once per module)."""
  if name not in _FITS:
    method = methods.get(name)
    _FITS[name] = method.fit(
        jax.random.PRNGKey(0),
        tiny[0],
        _tiny_config(name),
        context=tiny[3] if method.uses_context else None,
    )
  return _FITS[name]


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, marks=pytest.mark.slow) if n == "ens15" else n  # ens3 covers its code path
        for n in list(defaults.MAIN_METHODS) + ["csd_matched"]
    ],
)
def test_fit_score_predict_and_easy_auroc(tiny, name):
  _, test_ds, noise, _ = tiny
  method = methods.get(name)
  state = _fitted(tiny, name)
  score = jax.jit(method.score)
  s_in, s_out = np.asarray(score(state, test_ds.images)), np.asarray(score(state, noise.images))
  probs = np.asarray(jax.jit(method.predict)(state, test_ds.images))
  assert s_in.shape == (100,) and s_out.shape == (100,)
  assert np.all(np.isfinite(s_in)) and np.all(np.isfinite(s_out))
  assert probs.shape == (100, 10)
  np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-4)
  # MNIST vs uniform noise is easy: every method must separate it.
  assert metrics.ood_metrics(s_in, s_out)["auroc"] > 0.85, name
  # A tiny budget still learns digits well above chance (10 %).
  assert metrics.accuracy(probs, test_ds.labels) > 0.4


def test_checkpoint_roundtrip_gives_the_same_scores(tiny, tmp_path):
  test_ds = tiny[1]
  method = methods.get("csd")
  state = _fitted(tiny, "csd")
  config = state.config
  checkpoint.save_pytree(str(tmp_path / "ckpt"), state.arrays)
  assert checkpoint.exists(str(tmp_path / "ckpt"))
  # the config as a cell records it (JSON) rebuilds the state: the same static metadata
  restored = MethodState(
      arrays=checkpoint.restore_pytree(str(tmp_path / "ckpt")),
      config=cli.freeze(json.loads(json.dumps(cli.to_dict(config)))),
  )
  assert restored.config == state.config and hash(restored.config) == hash(state.config)
  score = jax.jit(method.score)  # one program for both states
  np.testing.assert_allclose(
      score(restored, test_ds.images[:20]), score(state, test_ds.images[:20]), rtol=1e-5
  )


def test_csd_ood_requires_context(tiny):
  with pytest.raises(ValueError, match="context"):
    methods.get("csd_ood").fit(jax.random.PRNGKey(0), tiny[0], _tiny_config("csd_ood"))


@pytest.mark.slow
def test_ensemble_modes_agree(tiny):
  """vmap and sequential training give the same members for the same key."""
  train_ds = tiny[0]
  spec = train.spec_from_config(
      {"convs": [[4, 5, 4]], "widths": [16], "parameterization": "standard"}, out_dim=10
  )
  kw = dict(num_members=2, num_steps=3, batch_size=16, lr=1e-3)
  a, _ = train.train_ensemble(
      jax.random.PRNGKey(0), spec, train_ds.images, train_ds.labels, mode="vmap", **kw
  )
  b, _ = train.train_ensemble(
      jax.random.PRNGKey(0), spec, train_ds.images, train_ds.labels, mode="sequential", **kw
  )
  for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
    np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-6)
  la = train.ensemble_logits(spec, a, train_ds.images[:8], "vmap")
  lb = train.ensemble_logits(spec, a, train_ds.images[:8], "sequential")
  np.testing.assert_allclose(la, lb, rtol=1e-4, atol=1e-5)


def test_smaller_ensemble_is_the_larger_ones_first_members(tiny):
  """ENS(2)'s members are ENS(3)'s first two, served from the cache with their training time."""
  train_ds = tiny[0]
  spec = train.spec_from_config({"convs": [[4, 5, 4]], "widths": [16]}, out_dim=10)
  kw = dict(num_steps=3, batch_size=16, lr=1e-3, mode="sequential")
  train.clear_classifier_cache()
  key = jax.random.PRNGKey(7)
  big, _ = train.train_ensemble(key, spec, train_ds.images, train_ds.labels, num_members=3, **kw)
  before = train.reused_seconds()
  small, _ = train.train_ensemble(key, spec, train_ds.images, train_ds.labels, num_members=2, **kw)
  assert train.reused_seconds() > before  # both members came from the cache, at a cost > 0
  train.clear_classifier_cache()
  fresh, _ = train.train_ensemble(key, spec, train_ds.images, train_ds.labels, num_members=2, **kw)
  for s, b, f in zip(*map(jax.tree_util.tree_leaves, (small, big, fresh))):
    np.testing.assert_array_equal(s, b[:2])
    np.testing.assert_array_equal(s, f)


def test_sample_uncertainty():
  agree = jnp.tile(30.0 * jnp.eye(10)[None, :1], (3, 1, 1))  # 3 members, one input
  disagree = 30.0 * jnp.eye(10)[:3][:, None]  # each says a different class
  for kind in scores.SCORE_KINDS:
    lo = float(scores.sample_uncertainty(agree, kind)[0])
    hi = float(scores.sample_uncertainty(disagree, kind)[0])
    assert hi > lo, kind
    assert abs(lo) < 1e-6, kind
  np.testing.assert_allclose(
      scores.sample_uncertainty(disagree, "mutual_information"), [np.log(3)], rtol=1e-5
  )
  two = jnp.array([[[1.0, 0.0]], [[3.0, 0.0]]])  # z_1 ∈ {1, 3}, z_2 = 0
  np.testing.assert_allclose(scores.sample_uncertainty(two, "logit_variance"), [1.0])
  np.testing.assert_allclose(scores.sample_uncertainty(two, "relative_logit_variance"), [0.2])
  with pytest.raises(ValueError):
    scores.sample_uncertainty(agree, "nope")


def test_config_for_merges_and_hashes():
  a = methods.config_for("ens3")
  b = methods.config_for("ens3", {"train": {"num_steps": 7}})
  assert b.train.num_steps == 7 and b.train.batch_size == a.train.batch_size
  assert hash(a) == hash(methods.config_for("ens3")) and a == methods.config_for("ens3")
  assert a != b
  with pytest.raises(ValueError, match="unknown config key"):
    methods.config_for("ens3", {"nope": 1})
  assert cli.to_dict(a)["backbone"]["convs"] == [list(c) for c in defaults.BACKBONE["convs"]]
  # a config file's editable copy overrides every field, None ones included; freezing it gives
  # the config
  e = cli.editable(defaults.rnd())
  e.num_steps, e.train.num_steps = 5, 7
  assert methods.config_for("rnd", e) == cli.freeze(e)
  assert methods.get("rnd").default_config == cli.freeze(defaults.rnd())
  assert cli.replace(a, score="entropy").score == "entropy"
  with pytest.raises(ValueError, match="unknown config keys"):
    cli.replace(a, nope=1)


def test_plain_defaults_agree_with_the_code_they_configure():
  """``defaults`` imports no JAX, so it writes out the library's deep-form defaults and the
  paper's augmentation list; they must stay those of ``csd_jax`` and ``augment``."""
  assert defaults.CSD_DEEP == csd.DEEP_DEFAULTS
  assert defaults.PAPER_AUGMENTATIONS == augment.PAPER_AUGMENTATIONS


def test_spec_from_config_names_a_misspelt_network_field():
  good = {"convs": [[4, 5, 4]], "widths": [16]}
  assert train.spec_from_config(good, out_dim=3).widths == (16,)
  with pytest.raises(ValueError, match=r"unknown network field\(s\) 'widhts'; valid: .*widths"):
    train.spec_from_config({"convs": [[4, 5, 4]], "widhts": [16]})
  # a caller that passes a larger config on purpose names the keys to leave out
  assert train.spec_from_config({**good, "lr": 0.1}, ignore=("lr",)).widths == (16,)
  for name in methods.METHODS:  # every method's backbone holds network fields only
    train.classifier_spec(methods.config_for(name))


def test_registry_is_complete():
  for name in (
      "csd",
      "csd_aug",
      "csd_ood",
      "ens3",
      "ens15",
      "mc_dropout",
      "laplace",
      "rnd",
      "csd_matched",
      "csd_deep",
      "csd_aug_no_overlap",
  ):
    m = methods.get(name)
    assert callable(m.fit) and callable(m.score) and callable(m.predict)
    assert "backbone" in m.default_config and "train" in m.default_config
  assert methods.get("csd_ood").uses_context and not methods.get("csd").uses_context
  assert methods.get("ens15").default_config["num_members"] == 15
  with pytest.raises(ValueError):
    methods.get("nope")


def test_sgld_keeps_distinct_samples_after_burn_in(tiny):
  """The chain keeps ``num_samples`` positions (all moved off the start and from each other), its
  length is burn-in + thin × samples, and bad settings are refused."""
  train_ds, test_ds, _, _ = tiny
  state = _fitted(tiny, "bnn_mcmc")
  config = state.config
  assert sgld.num_steps(config) == 50 + 12 * 4  # small_budget(100): burn-in 50, thin 12, 4 kept
  head = np.asarray(state.arrays["samples"]["params"]["head"]["kernel"])
  assert head.shape[0] == 4
  assert np.all(np.abs(head).reshape(4, -1).max(1) > 0)  # every slot was written
  gaps = [np.abs(head[i] - head[i + 1]).max() for i in range(3)]
  assert min(gaps) > 0  # the chain moved between them
  logits = sgld.sample_logits(state, test_ds.images[:5])
  assert logits.shape == (4, 5, 10)
  for bad in ({"num_samples": 1}, {"thin": 0}, {"step_size": 0.0}, {"temperature": -1.0}):
    with pytest.raises(ValueError):
      methods.get("bnn_mcmc").fit(jax.random.PRNGKey(0), train_ds, cli.replace(config, **bad))
