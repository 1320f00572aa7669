"""The DQN-family learner (rl.dqn), its replay buffer (rl.replay) and bonuses (rl.bonus)."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flashbax.buffers import sum_tree

from configs import deepsea as deepsea_configs
from configs import vizdoom as vizdoom_configs
from csd_jax import csd
from csd_jax import models
from rl import agents
from rl import bonus as bonus_lib
from rl import dqn
from rl import dqn_config
from rl import networks
from rl import replay as replay_lib
from rl import run_config
from uncertainty_kit import novelty

SIZE, E = 5, 4
OBS = (SIZE * SIZE,)


def deep_sea_config(agent: str, **kw) -> dqn_config.Config:
  base = dict(
      agent=agent,
      num_actions=2,
      obs_shape=OBS,
      num_envs=E,
      q_spec=networks.mlp_spec((16, 16), 2),
      n_step=3,
      batch_size=16,
      target_sync_updates=2,
      learning_starts=0,
      buffer_rows=64,
      eps_start=0.5,
      eps_end=0.5,
      bonus_coef=0.1,
      rnd_lr=1e-3,
  )
  if agent == "bdqn":
    base.update(num_heads=3, shared_torso=False, prior_scale=3.0, mask_prob=0.5)
  if agent in ("csd", "csd_sa"):
    base.update(bonus_spec=models.MLPSpec(widths=(64,), out_dim=1))
  if agent == "csd_sa":
    base.update(csd_towers=networks.mlp_spec((16, 16), 1), csd_embed_dim=16)
  if agent in ("rnd", "rnd_sa"):
    base.update(bonus_spec=networks.mlp_spec((16,), 1))
  base.update(kw)
  return dqn_config.Config(**base)


def pixel_config(agent: str) -> dqn_config.Config:
  """A small CNN on (12, 16, 16) uint8 pixels: the VizDoom code path, scaled down."""
  spec = models.CNNSpec(
      convs=((4, 4, 2), (8, 3, 2)),
      widths=(32,),
      padding="VALID",
      out_dim=1,
      parameterization="standard",
  )
  kw = dict(
      agent=agent,
      num_actions=3,
      obs_shape=(12, 16, 16),
      num_envs=2,
      q_spec=spec,
      n_step=4,
      batch_size=8,
      learning_starts=0,
      buffer_rows=32,
      bonus_coef=0.1,
      bonus_at_update=False,
  )
  if agent == "bdqn":
    kw.update(num_heads=3, shared_torso=True, prior_scale=1.0, mask_prob=0.5)
  if agent in ("csd", "rnd"):
    kw.update(bonus_spec=dataclasses.replace(spec, parameterization="ntk"))
  return dqn_config.Config(**kw)


@functools.lru_cache(maxsize=None)
def jitted(name: str, cfg: dqn_config.Config):
  """``dqn.<name>`` with ``cfg`` bound, jitted once per (name, cfg): the tests of one config
  share its compiles."""
  return jax.jit(functools.partial(getattr(dqn, name), cfg))


# replay_lib.sample jitted (batch size, n and γ static), one program per shape for every test
sample = jax.jit(replay_lib.sample, static_argnums=(2, 3, 4), static_argnames="with_next_obs_seq")


def random_obs(cfg: dqn_config.Config, rng: np.random.Generator) -> np.ndarray:
  if len(cfg.obs_shape) == 3:
    return rng.integers(0, 256, (cfg.num_envs, *cfg.obs_shape), dtype=np.uint8)
  return np.eye(cfg.obs_shape[0], dtype=np.float32)[rng.integers(0, cfg.obs_shape[0], cfg.num_envs)]


def filled_state(cfg: dqn_config.Config, steps: int = 20, seed: int = 0) -> dqn.AgentState:
  rng = np.random.default_rng(seed)
  obs = random_obs(cfg, rng)
  state = dqn.init(cfg, jax.random.PRNGKey(seed), jnp.asarray(obs))
  state, actions = dqn.first_actions(cfg, state, jnp.asarray(obs))
  observe = jitted("observe", cfg)
  for t in range(steps):
    nxt = random_obs(cfg, rng)
    done = np.full(cfg.num_envs, t % 7 == 6)
    valid = np.full(cfg.num_envs, t % 7 != 0 or t == 0)
    state, actions = observe(
        state,
        jnp.asarray(obs),
        actions,
        jnp.asarray(nxt),
        jnp.asarray(rng.normal(size=cfg.num_envs), jnp.float32),
        jnp.asarray(done),
        jnp.asarray(done),
        jnp.asarray(valid),
    )
    obs = nxt
  return state


def tree_changed(a, b) -> bool:
  return any(not np.allclose(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


# The pixel (CNN) learners take 20-30 s each to compile on 2 CPU cores: csd (collection-time
# bonus on a CNN prior) runs by default, the others slow (bdqn's heads and prior are the vector
# case's code); so does a one-stage IMPALA DQN with spectral normalisation (~6 s).
_CASES = (
    [("vector", a) for a in agents.NAMES]
    + [("pixels", "csd"), ("impala_sn", "dqn")]
    + [
        pytest.param("vector_c51", "csd_sa", marks=pytest.mark.slow),
        pytest.param("pixels", "bdqn", marks=pytest.mark.slow),
    ]
    + [pytest.param("pixels", a, marks=pytest.mark.slow) for a in ("dqn", "rnd")]
)


@pytest.mark.parametrize("obs_kind,agent", _CASES)
def test_one_update_changes_params(agent, obs_kind):
  cfg = {
      "vector": lambda: deep_sea_config(agent),
      "pixels": lambda: pixel_config(agent),
      "vector_c51": lambda: deep_sea_config(agent, num_atoms=11),
      "impala_sn": lambda: dataclasses.replace(
          pixel_config(agent), q_spec=networks.ImpalaSpec((4,), (16,), spectral_norm=True)
      ),
  }[obs_kind]()
  state = filled_state(cfg)
  learner, _, metrics = jitted("update", cfg)(state.learner, state.replay, jax.random.PRNGKey(1))
  assert tree_changed(state.learner.params, learner.params)
  assert not tree_changed(state.learner.target_params, learner.target_params) or (
      cfg.target_sync_updates == 1
  )
  for k in dqn.metric_names(cfg):
    assert np.isfinite(metrics[k]), (k, metrics[k])
  if cfg.bonus_kind != "none":
    assert tree_changed(state.learner.bonus_state, learner.bonus_state)
    assert float(metrics["bonus_raw"]) > 0
  if agent == "bdqn":  # the prior is frozen
    assert not tree_changed(state.learner.prior_params, learner.prior_params)
  if cfg.state_action:
    assert tree_changed(state.learner.intrinsic.params, learner.intrinsic.params)
  if obs_kind == "impala_sn":  # the power iteration advanced
    assert tree_changed(state.learner.params["batch_stats"], learner.params["batch_stats"])


def _fit_pairs(bonus, states: jax.Array, action: int, steps: int = 200):
  """A bonus on (state, action) pairs trained on ``states`` (N, D) with one ``action``."""
  pairs = bonus_lib.pair_inputs(states, jnp.full(states.shape[0], action), 2)
  state = bonus.init(jax.random.PRNGKey(0), models.as_array(bonus_lib.all_pairs(states, 2)))
  update = jax.jit(bonus.update)
  for i in range(steps):
    idx = jax.random.randint(jax.random.PRNGKey(i), (32,), 0, states.shape[0])
    state, _ = update(state, pairs[idx])
  return state


@pytest.mark.parametrize("kind", ["csd", "rnd"])
def test_all_pairs_scored_unmaterialised_as_materialised(kind):
  """Every action's bonus at flat observations (``all_pairs``: a OneHotProduct) equals the bonus
  of the materialised pairs, for deep CSD (prior, φ and ψ) and RND after a few updates."""
  states = jax.random.uniform(jax.random.PRNGKey(0), (12, 9))
  bonus = bonus_lib.make(
      kind,
      models.MLPSpec(widths=(64,), out_dim=1),
      csd_towers=networks.mlp_spec((32,), 1) if kind == "csd" else None,
      csd_embed_dim=16,
  )
  state = _fit_pairs(bonus, states, action=1, steps=5)
  product = bonus_lib.all_pairs(states, 2)
  assert isinstance(product, models.OneHotProduct)
  score = jax.jit(bonus.score)
  np.testing.assert_allclose(
      score(state, product), score(state, models.as_array(product)), rtol=1e-5, atol=1e-6
  )


def test_state_action_csd_bonus_higher_for_the_untried_action():
  """Deep CSD on (one-hot state, one-hot action) pairs, fitted on 20 states with action 0 only:
  at those states the untried action 1 keeps a larger bonus than the replayed action 0."""
  states = jnp.eye(30, dtype=jnp.float32)[:20]
  bonus = bonus_lib.make(
      "csd",
      models.MLPSpec(widths=(256,), out_dim=1),
      csd_towers=networks.mlp_spec((64, 64), 1),
      csd_embed_dim=32,
  )
  state = _fit_pairs(bonus, states, action=0)
  r = np.asarray(bonus.score(state, bonus_lib.all_pairs(states, 2))).reshape(20, 2)
  assert (r[:, 1] > r[:, 0]).all()
  assert r[:, 1].mean() > 3 * r[:, 0].mean()


def test_reward_prior_raises_the_intrinsic_value_of_an_untried_action():
  """A hand-made case: the intrinsic head's Q_in is zero for both actions and the bonus was
  fitted on (s, 0) only; the reward prior then makes Q̂_in(s, 1) > Q̂_in(s, 0), and a greedy
  csd_sa agent (β > 0, no ε) picks the untried action 1 at every such state."""
  cfg = deep_sea_config("csd_sa", eps_start=0.0, eps_end=0.0, bonus_coef=1.0)
  states = jnp.eye(SIZE * SIZE, dtype=jnp.float32)[:E]
  agent = dqn.init(cfg, jax.random.PRNGKey(0), states)
  bonus_state = _fit_pairs(dqn.bonus_fns(cfg), states, action=0)
  zero = lambda t: jax.tree.map(jnp.zeros_like, t)
  learner = agent.learner._replace(
      params=zero(agent.learner.params),
      bonus_state=bonus_state,
      bonus_stats=bonus_lib.RunningStats(jnp.float32(0.0), jnp.float32(1.0), jnp.float32(1.0)),
      intrinsic=agent.learner.intrinsic._replace(params=zero(agent.learner.intrinsic.params)),
  )
  prior = jitted("reward_prior", cfg)(learner, states)
  q_hat = jitted("intrinsic_q", cfg)(learner.intrinsic.params, states, prior)
  np.testing.assert_allclose(q_hat, prior)  # Q_in = 0: Q̂_in is the prior alone
  assert (q_hat[:, 1] > q_hat[:, 0]).all()
  actions = jitted("act", cfg)(learner, agent.heads, states, agent.env_steps, jax.random.PRNGKey(1))
  np.testing.assert_array_equal(actions, np.ones(E))


def test_intrinsic_head_discounts_by_its_own_gamma():
  """With Q_in = 0 the intrinsic head's n-step target is Σ_k γ_in^k r_k (steps up to the first
  episode end) + γ_in^m · max_a prior(s_boot, a), 0 after a terminal."""
  cfg = deep_sea_config("csd_sa", gamma=0.9, intrinsic_gamma=0.5)
  state = filled_state(cfg)
  zero = lambda t: jax.tree.map(jnp.zeros_like, t)
  head = state.learner.intrinsic
  learner = state.learner._replace(
      intrinsic=head._replace(params=zero(head.params), target_params=zero(head.target_params))
  )
  batch = sample(
      state.replay,
      jax.random.PRNGKey(3),
      cfg.batch_size,
      cfg.n_step,
      cfg.gamma,
      with_next_obs_seq=True,
  )
  reward = jax.random.normal(jax.random.PRNGKey(4), batch.reward.shape)
  _, metrics = jitted("intrinsic_loss", cfg)(head.params, learner, batch, reward)
  g = cfg.intrinsic_discount
  assert g == 0.5
  mask, boot = np.asarray(batch.step_mask), np.asarray(batch.boot_discount)
  ret = np.sum(mask * g ** np.arange(cfg.n_step) * np.asarray(reward), axis=1)
  prior_b = jitted("reward_prior", cfg)(learner, networks.preprocess(batch.boot_obs))
  prior_b = np.asarray(prior_b).max(axis=1)
  target = ret + np.where(boot > 0, g ** mask.sum(axis=1), 0.0) * prior_b
  assert (boot == 0).any() and (boot > 0).any()  # both kinds of sample in the batch
  np.testing.assert_allclose(float(metrics["int_target_mean"]), target.mean(), rtol=1e-5)


def test_categorical_projection_splits_mass_between_neighbours_and_clips():
  """Bellemare et al.'s projection on the atoms −1, −0.8, …, 1: a mass at 0.5 splits ½ / ½
  between 0.4 and 0.6, one at 0.45 gives ¾ to 0.4, one beyond 1 lands on 1; mass is kept."""
  z = jnp.linspace(-1.0, 1.0, 11)
  probs = jnp.zeros((3, 11)).at[:, 0].set(1.0)
  target_z = jnp.stack([z - z[0] + 0.5, z - z[0] + 0.45, z - z[0] + 3.0])  # atom 0 moves there
  out = np.asarray(dqn.categorical_projection(z, probs, target_z))
  np.testing.assert_allclose(out.sum(axis=1), 1.0, atol=1e-5)
  np.testing.assert_allclose(out[0, [7, 8]], [0.5, 0.5], atol=1e-5)
  np.testing.assert_allclose(out[1, [7, 8]], [0.75, 0.25], atol=1e-5)
  np.testing.assert_allclose(out[2, 10], 1.0, atol=1e-5)


def small_frames_csd_sa(**kw) -> dqn_config.Config:
  """csd_sa on (6, 8, 8) frames: one small conv Q-net, the bonus's MLPs on frames pooled 2x."""
  return dqn_config.Config(
      **dict(
          agent="csd_sa",
          num_actions=3,
          obs_shape=(6, 8, 8),
          num_envs=2,
          q_spec=networks.conv_spec(((4, 3, 2),), "VALID", (16,), 1),
          bonus_spec=networks.mlp_spec((16,), 1),
          csd_towers=networks.mlp_spec((16,), 1),
          csd_embed_dim=8,
          bonus_pool=2,
          n_step=2,
          batch_size=8,
          learning_starts=0,
          buffer_rows=16,
          bonus_coef=0.1,
      )
      | kw
  )


@pytest.mark.parametrize("factor", [3, 6, 12])
def test_pooling_averages_each_factor_sized_window(factor):
  """A composite factor pools in steps (3 then 2 for 6) over the same windows as one pool; the
  frame's border past the last whole window is dropped."""
  x = jax.random.uniform(jax.random.PRNGKey(0), (2, 44, 45, 3))
  h, w = 44 // factor, 45 // factor
  windows = x[:, : h * factor, : w * factor].reshape(2, h, factor, w, factor, 3)
  np.testing.assert_allclose(
      jax.jit(dqn.pooled, static_argnums=1)(x, factor),
      windows.mean(axis=(2, 4)).reshape(2, -1),
      atol=1e-6,
  )


def test_pooled_intrinsic_net_is_the_q_net_on_the_pooled_frames():
  """intrinsic_pool: Q_in is the Q-net's architecture (its convs, then its dense widths) on the
  frames average-pooled by that factor, trained by the update; only a state-action agent's own
  intrinsic net on frames takes it."""
  cfg = small_frames_csd_sa(intrinsic_pool=2)
  state = filled_state(cfg)
  kernels = [k.shape for k in jax.tree.leaves(state.learner.intrinsic.params) if k.ndim >= 2]
  # 8x8 frames of 6 channels pooled 2x: the 3x3 VALID conv of stride 2 leaves 1x1x4, then 16
  assert kernels == [(3, 3, 6, 4), (4, 16), (16, 3)]
  x = networks.preprocess(state.replay.obs[0])  # (E, 8, 8, 6)
  by_hand = x.reshape((2, 4, 2, 4, 2, 6)).mean(axis=(2, 4))
  np.testing.assert_allclose(
      jitted("intrinsic_values", cfg)(state.learner.intrinsic.params, x),
      dqn.intrinsic_network(cfg).apply(state.learner.intrinsic.params, by_hand)[:, 0],
      rtol=1e-5,
  )
  learner, _, metrics = jitted("update", cfg)(state.learner, state.replay, jax.random.PRNGKey(1))
  assert tree_changed(state.learner.intrinsic.params, learner.intrinsic.params)
  assert np.isfinite(metrics["int_loss"]) and float(metrics["int_loss"]) > 0
  for bad in (
      dict(intrinsic_shares_torso=True),
      dict(agent="csd", csd_towers=None),
  ):
    with pytest.raises(ValueError, match="intrinsic_pool > 1 needs a state-action agent's own"):
      dataclasses.replace(cfg, **bad)
  with pytest.raises(ValueError, match="intrinsic_pool > 1 needs"):
    deep_sea_config("csd_sa", intrinsic_pool=2)


def test_stored_bonus_features_give_the_rewards_of_the_frames_they_pool():
  """With the state-action bonus on pooled frames, replay stores each step's pooled frames once
  (at collection); an update reads its n-step windows from them, and the window's intrinsic
  rewards are those of pooling the window's stored frames at update time, to rounding (XLA
  fuses the uint8 scaling with the pooling differently in the two programs: 1 ulp)."""
  cfg = small_frames_csd_sa(n_step=3)
  assert cfg.stores_bonus_features
  assert not deep_sea_config("csd_sa").stores_bonus_features  # flat observations: nothing to pool
  assert not small_frames_csd_sa(bonus_pool=1).stores_bonus_features
  state = filled_state(cfg)  # 20 steps into 16 rows: every row written
  buf = state.replay
  assert buf.features.shape == (16, 2, 4 * 4 * 6)
  pool = jax.jit(lambda obs: dqn.bonus_features(cfg, networks.preprocess(obs)))
  np.testing.assert_allclose(
      buf.features.reshape((-1, buf.features.shape[-1])),
      pool(buf.obs.reshape((-1, *cfg.obs_shape))),
      rtol=3e-7,
  )
  key = jax.random.PRNGKey(3)
  batch = jitted("sample_batch", cfg)(buf, key, 0)
  assert batch.next_obs_seq is None and batch.feature_seq.shape == (8, 3, 96)
  raw, _ = jitted("intrinsic_rewards", cfg)(state.learner, batch)
  # the same draw with the window's frames instead, pooled here
  window = sample(buf, key, 8, 3, cfg.gamma, with_next_obs_seq=True)
  np.testing.assert_array_equal(window.action_seq, batch.action_seq)
  seq = jnp.concatenate([window.obs[:, None], window.next_obs_seq[:, :-1]], axis=1)
  pairs = dqn.bonus_inputs(
      cfg, networks.preprocess(seq.reshape((-1, *cfg.obs_shape))), window.action_seq.reshape(-1)
  )
  by_frames = jax.jit(dqn.bonus_fns(cfg).score)(state.learner.bonus_state, pairs)
  np.testing.assert_allclose(raw, by_frames.reshape(raw.shape), rtol=1e-5)
  with pytest.raises(ValueError, match="features must be given exactly when"):
    row = (buf.obs, buf.action, buf.reward, buf.bonus, buf.done, buf.terminated, buf.valid)
    replay_lib.add(buf, *(x[0] for x in row), buf.mask[0])  # no features for a buffer of them


@pytest.mark.slow
def test_augmented_contexts_train_the_csd_bonus_differently():
  """context_augment: CSD's contexts are the bonus inputs' augmentations (here all of them), so
  the bonus's update differs from the C = X one on the same batch, and the Q update does not."""
  cfg = small_frames_csd_sa(context_augment=1.0)
  state = filled_state(cfg)
  run = lambda c: jitted("update", c)(state.learner, state.replay, jax.random.PRNGKey(1))[0]
  plain, augmented = run(dataclasses.replace(cfg, context_augment=0.0)), run(cfg)
  assert tree_changed(plain.bonus_state, augmented.bonus_state)
  assert not tree_changed(plain.params, augmented.params)
  with pytest.raises(ValueError, match="context_augment needs a csd bonus on image"):
    deep_sea_config("csd_sa", context_augment=0.25)


@pytest.mark.slow
def test_impala_q_network_shapes_and_residual_stages():
  """The IMPALA Q-net: each stage halves the frame (max-pool, stride 2) and holds a conv and
  two residual blocks of two convs; (B, 42, 42, 6) frames give (B, K, A) Q-values."""
  spec = networks.ImpalaSpec(channels=(4, 8), widths=(16,))
  net = networks.QNetwork(spec, num_actions=5, num_heads=2)
  x = jnp.zeros((3, 42, 42, 6))
  params = net.init(jax.random.PRNGKey(0), x)
  assert net.apply(params, x).shape == (3, 2, 5)
  kernels = [p for p in jax.tree.leaves(params) if p.ndim == 4]
  assert len(kernels) == 2 * 5 and kernels[0].shape == (3, 3, 6, 4)
  dense = [p for p in jax.tree.leaves(params) if p.ndim == 2]
  assert dense[0].shape == (11 * 11 * 8, 16)  # 42 -> 21 -> 11
  with pytest.raises(ValueError, match="channels must be non-empty"):
    networks.ImpalaSpec(channels=())


def test_spectral_norm_divides_the_dense_kernel_by_its_largest_singular_value():
  """After some refreshes the stored σ is the kernel's top singular value, and the Q-net equals
  the plain net whose hidden dense kernel is divided by it."""
  spec = networks.ImpalaSpec(channels=(4,), widths=(16,), spectral_norm=True)
  net, plain = networks.QNetwork(spec, 3), networks.QNetwork(
      dataclasses.replace(spec, spectral_norm=False), 3
  )
  x = jax.random.uniform(jax.random.PRNGKey(0), (5, 16, 16, 6))
  v = net.init(jax.random.PRNGKey(1), x)
  assert networks.refresh_spectral_norm(plain, {"params": v["params"]}, x) == {
      "params": v["params"]
  }
  refresh = jax.jit(lambda v: networks.refresh_spectral_norm(net, v, x))
  for _ in range(300):  # power iteration: converges at the rate of the top two singular values
    v = refresh(v)
  kernel = np.asarray(v["params"]["net"]["Dense_0"]["kernel"])
  top = np.linalg.svd(kernel, compute_uv=False)[0]
  sigma = float(v["batch_stats"]["net"]["SpectralNorm_0"]["Dense_0/kernel/sigma"])
  assert sigma == pytest.approx(top, rel=1e-4) and abs(top - 1.0) > 0.05  # a real rescaling
  scaled = jax.tree.map(lambda a: a, v["params"])
  scaled["net"]["Dense_0"]["kernel"] = kernel / top
  np.testing.assert_allclose(
      net.apply(v, x), plain.apply({"params": scaled}, x), rtol=1e-4, atol=1e-6
  )
  with pytest.raises(ValueError, match="one shared torso"):
    networks.QNetwork(spec, 3, num_heads=2, shared_torso=False).init(jax.random.PRNGKey(1), x)


def test_c51_learns_the_return_distribution_of_a_terminal_transition():
  """C51 (``dqn.c51_loss``): terminal one-step transitions of reward 0.5 from
  one state, action 1; after some Adam steps on that batch, the action's distribution has
  its mass on the two atoms around 0.5 and Q(s, 1) ≈ 0.5."""
  cfg = deep_sea_config("dqn", n_step=1, num_atoms=11, learning_rate=1e-2)
  state = filled_state(cfg)
  b = cfg.batch_size
  obs = jnp.tile(jnp.eye(SIZE * SIZE, dtype=jnp.float32)[:1], (b, 1))
  batch = replay_lib.Batch(
      obs=obs,
      action=jnp.ones(b, jnp.int32),
      reward=jnp.full((b, 1), 0.5),
      bonus=jnp.zeros((b, 1)),
      step_mask=jnp.ones((b, 1)),
      boot_obs=obs,
      boot_discount=jnp.zeros(b),
      next_obs=obs,
      next_obs_seq=None,
      action_seq=None,
      mask=jnp.ones((b, 1), bool),
      weight=jnp.ones(b),
      index=jnp.arange(b),
  )
  opt = dqn.optimizer(cfg)

  @jax.jit
  def step(params, opt_state):
    (loss, _), g = jax.value_and_grad(
        lambda p: dqn.q_loss(cfg, p, state.learner, batch, batch.reward), has_aux=True
    )(params)
    updates, opt_state = opt.update(g, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  params, opt_state = state.learner.params, opt.init(state.learner.params)
  losses = []
  for _ in range(200):
    params, opt_state, loss = step(params, opt_state)
    losses.append(float(loss))
  q = dqn.q_values(cfg, params, {}, obs[:1])[0, 0]
  # 0.5 lies halfway between the atoms 0.4 and 0.6: the projected target is (½, ½) there, so
  # the cross-entropy's floor is its entropy, ln 2
  assert abs(float(q[1]) - 0.5) < 0.05 and abs(losses[-1] - np.log(2.0)) < 0.05 < losses[0] - 1
  probs = jax.nn.softmax(dqn.q_network(cfg).apply(params, obs[:1])[0, 0, 1])
  z = np.asarray(dqn.atoms(cfg))
  assert float(jnp.sum(probs * (np.abs(z - 0.5) < 0.11))) > 0.9  # atoms 0.4, 0.6
  with pytest.raises(ValueError, match="C51"):
    deep_sea_config("bdqn", num_atoms=11)


def test_learn_respects_learning_starts_and_syncs_target():
  cfg = deep_sea_config("dqn", learning_starts=10_000, target_sync_updates=1)
  state = filled_state(cfg)
  after, m = jitted("learn", cfg)(state)
  assert float(m["updated"]) == 0 and not tree_changed(state.learner.params, after.learner.params)
  cfg = dataclasses.replace(cfg, learning_starts=0)
  after, m = jitted("learn", cfg)(state)
  assert float(m["updated"]) == 1
  assert tree_changed(state.learner.params, after.learner.params)
  assert not tree_changed(after.learner.params, after.learner.target_params)  # synced


def test_update_period_learns_on_every_kth_vectorised_step_only():
  """update_period=3: ready on vectorised steps 3, 6, ... (env_steps grows by num_envs)."""
  cfg = deep_sea_config("dqn", learning_starts=0, update_period=3)
  state = filled_state(cfg)
  ready = [
      bool(dqn.ready_to_learn(cfg, state._replace(env_steps=jnp.asarray(k * E, jnp.int32))))
      for k in range(1, 8)
  ]
  assert ready == [False, False, True, False, False, True, False]


def test_update_period_keeps_the_target_sync_in_env_steps():
  """One env learning every 4th step syncs its target every as many env steps as 4 envs
  learning every step: the same updates per env step."""
  run = run_config.profile(run_config.DeepSea, "dqn")
  four = dataclasses.replace(run, dqn=dataclasses.replace(run.dqn, num_envs=4))
  one = dataclasses.replace(run, dqn=dataclasses.replace(run.dqn, num_envs=1, update_period=4))
  learners = [
      run_config.learner(
          r,
          obs_shape=OBS,
          num_actions=2,
          q_spec=networks.mlp_spec((16,), 2),
          bonus_spec=None,
          shared_torso=False,
      )
      for r in (four, one)
  ]
  assert learners[0].target_sync_updates == learners[1].target_sync_updates
  assert (learners[0].update_period, learners[1].update_period) == (1, 4)


@pytest.mark.parametrize("learning_starts", [0, 10_000])
def test_host_decided_learn_matches_the_device_decided_one(learning_starts):
  """dqn.learn(ready=<host bool>) (the VizDoom loop: no lax.cond around the conv backward
  passes) gives what the in-graph decision gives."""
  cfg = deep_sea_config("csd", learning_starts=learning_starts, updates_per_step=2)
  state = filled_state(cfg)
  ready = bool(dqn.ready_to_learn(cfg, state))
  assert ready == (learning_starts == 0)
  a, ma = jitted("learn", cfg)(state)
  b, mb = jax.jit(lambda s: dqn.learn(cfg, s, ready))(state)
  for x, y in zip(jax.tree.leaves(a.learner), jax.tree.leaves(b.learner), strict=True):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6, atol=1e-7)
  assert float(ma["updated"]) == float(mb["updated"]) == float(ready)


def test_heads_resampled_only_at_episode_end():
  cfg = deep_sea_config("bdqn", num_heads=50)
  rng = np.random.default_rng(0)
  obs = jnp.asarray(random_obs(cfg, rng))
  state = dqn.init(cfg, jax.random.PRNGKey(0), obs)
  heads0 = np.asarray(state.heads)
  z = jnp.zeros(E)
  done = jnp.asarray([True, False, True, False])
  observe = jitted("observe", cfg)
  state, _ = observe(
      state,
      obs,
      jnp.zeros(E, jnp.int32),
      obs,
      z,
      jnp.zeros(E, bool),
      jnp.zeros(E, bool),
      jnp.ones(E, bool),
  )
  np.testing.assert_array_equal(np.asarray(state.heads), heads0)
  changed = []
  for _ in range(5):
    state, _ = observe(state, obs, jnp.zeros(E, jnp.int32), obs, z, done, done, jnp.ones(E, bool))
    changed.append(np.asarray(state.heads) != heads0)
    heads0 = np.asarray(state.heads)
  changed = np.array(changed)
  assert not changed[:, [1, 3]].any() and changed[:, [0, 2]].any()


# ------------------------------------------------------------------------------------------
# Replay.


def _fill(buf, rows):
  for r in rows:
    buf = replay_lib.add(buf, *r)
  return buf


def test_replay_never_samples_invalid_and_n_step_targets():
  """One env; episode of 3 steps then an auto-reset step (invalid), repeated; reward = row id."""
  n, gamma, cap = 2, 0.5, 40
  buf = replay_lib.init(cap, 1, (1,), jnp.float32, 1)
  rows = []
  for t in range(30):
    phase = t % 4  # 0, 1, 2: in-episode steps (2 ends it), 3: auto-reset (invalid)
    done = phase == 2
    valid = phase != 3
    rows.append(
        (
            jnp.array([[float(t)]]),
            jnp.array([t]),
            jnp.array([float(t)]),
            jnp.zeros(1),
            jnp.array([done]),
            jnp.array([done and t % 8 == 2]),
            jnp.array([valid]),
            jnp.ones((1, 1), bool),
        )
    )
  buf = _fill(buf, rows)
  batch = sample(buf, jax.random.PRNGKey(0), 512, n, gamma)
  t = np.asarray(batch.obs)[:, 0].astype(int)
  w = np.asarray(batch.weight)
  # 1/4 of the rows are invalid: a sample finds no valid candidate w.p. (1/4)^4; it then has
  # weight 0 (and no loss). Every weighted sample is a valid transition.
  assert w.mean() > 0.97
  assert not np.any((t % 4 == 3) & (w > 0)), "sampled an invalid (auto-reset) transition"
  assert np.all(t <= 30 - 1 - n)
  for i in np.flatnonzero(w > 0):
    ti = t[i]
    phase = ti % 4
    mask = np.asarray(batch.step_mask[i])
    if phase == 2:  # done at once: 1-step, bootstrap from the terminal obs (row t+1)
      np.testing.assert_array_equal(mask, [1, 0])
      assert float(batch.boot_obs[i, 0]) == ti + 1
      terminated = ti % 8 == 2
      assert float(batch.boot_discount[i]) == pytest.approx(0.0 if terminated else gamma)
    else:  # two steps within the episode
      np.testing.assert_array_equal(mask, [1, 1])
      assert float(batch.boot_obs[i, 0]) == ti + 2
      terminated = phase == 1 and (ti + 1) % 8 == 2
      assert float(batch.boot_discount[i]) == pytest.approx(0.0 if terminated else gamma**2)
    np.testing.assert_array_equal(np.asarray(batch.reward[i]), [ti, ti + 1])
    assert float(batch.next_obs[i, 0]) == ti + 1


def test_replay_ring_wraps_and_invalidate_last():
  buf = replay_lib.init(8, 2, (1,), jnp.float32, 1)
  for t in range(20):
    buf = replay_lib.add(
        buf,
        jnp.full((2, 1), float(t)),
        jnp.zeros(2, jnp.int32),
        jnp.zeros(2),
        jnp.zeros(2),
        jnp.zeros(2, bool),
        jnp.zeros(2, bool),
        jnp.ones(2, bool),
        jnp.ones((2, 1), bool),
    )
  batch = replay_lib.sample(buf, jax.random.PRNGKey(0), 256, 1, 0.9)
  t = np.asarray(batch.obs)[:, 0]
  assert t.min() >= 12 and t.max() <= 18  # rows 12 .. 19 are kept, 19 has no successor
  buf = replay_lib.invalidate_last(buf)
  assert not bool(buf.valid[19 % 8].any()) and bool(buf.done[19 % 8].all())


def _row(t: int, num_envs: int, valid) -> tuple:
  """A replay row whose obs of env e is t * num_envs + e (its leaf while t < capacity)."""
  return (
      jnp.arange(num_envs, dtype=jnp.float32)[:, None] + t * num_envs,
      jnp.zeros(num_envs, jnp.int32),
      jnp.zeros(num_envs),
      jnp.zeros(num_envs),
      jnp.zeros(num_envs, bool),
      jnp.zeros(num_envs, bool),
      jnp.asarray(valid),
      jnp.ones((num_envs, 1), bool),
  )


def test_prioritized_replay_tree_holds_exactly_the_sampleable_valid_transitions():
  """Through two wraps of the ring: a leaf is positive iff its row has its n successors stored,
  is not overwritten, and is valid; the root is the sum of the leaves."""
  cap, num_envs, n = 8, 3, 2
  buf = replay_lib.init(cap, num_envs, (1,), jnp.float32, 1, prioritized=True)
  add = jax.jit(lambda b, *r: replay_lib.add(b, *r, n_step=n))
  valid_rows = {}
  for count in range(1, 21):
    t = count - 1
    valid = np.array([True, t % 3 != 1, t % 2 == 0])
    valid_rows[t] = valid
    buf = add(buf, *_row(t, num_envs, valid))
    leaves = np.asarray(sum_tree.get_batch(buf.priority, jnp.arange(cap * num_envs)))
    expect = np.zeros((cap, num_envs), bool)
    for row in range(max(0, count - cap), count - n):
      expect[row % cap] = valid_rows[row]
    np.testing.assert_array_equal(leaves.reshape(cap, num_envs) > 0, expect, err_msg=str(count))
    assert float(buf.priority.nodes[0]) == pytest.approx(leaves.sum(), rel=1e-6)
  with pytest.raises(ValueError, match="needs n_step"):
    replay_lib.add(buf, *_row(0, num_envs, [True] * 3))


def test_prioritized_sampling_follows_priorities_with_importance_weights():
  """Six transitions, one of them at 9x the others' priority: it is drawn 9/14 of the time,
  and with β_IS = 1 its importance weight is 1/9 of theirs. A zero leaf stays zero."""
  cap, num_envs = 4, 2
  buf = replay_lib.init(cap, num_envs, (1,), jnp.float32, 1, prioritized=True)
  for t in range(cap):
    buf = replay_lib.add(buf, *_row(t, num_envs, [True, True]), n_step=1)
  heavy = 3  # row 1, env 1
  buf = replay_lib.update_priorities(
      buf, jnp.arange(6), jnp.where(jnp.arange(6) == heavy, 9.0, 1.0)
  )
  buf = replay_lib.update_priorities(buf, jnp.array([7]), jnp.array([5.0]))  # not sampleable
  assert float(sum_tree.get(buf.priority, 7)) == 0.0
  batch = sample(buf, jax.random.PRNGKey(0), 2800, 1, 0.9, importance_exponent=1.0)
  index = np.asarray(batch.index)
  np.testing.assert_array_equal(index, np.asarray(batch.obs)[:, 0].astype(int))
  assert index.max() < 6
  assert np.mean(index == heavy) == pytest.approx(9 / 14, abs=0.01)  # stratified: tight
  w = np.asarray(batch.weight)
  assert w.max() == pytest.approx(1.0)
  np.testing.assert_allclose(w[index == heavy], 1 / 9, rtol=1e-5)
  np.testing.assert_allclose(w[index != heavy], 1.0, rtol=1e-5)
  uniform = sample(buf, jax.random.PRNGKey(0), 64, 1, 0.9, importance_exponent=0.0)
  np.testing.assert_allclose(uniform.weight, 1.0)


def test_importance_exponent_default_is_the_run_configs():
  """A learner Config built without β_IS starts it where the DeepSea and VizDoom runs do."""
  default = deep_sea_config("dqn", prioritized=True).importance_exponent
  assert default == deepsea_configs.get_config("dqn").dqn.importance_exponent
  for setting in agents.SETTINGS:
    assert default == vizdoom_configs.get_config(f"dqn,{setting}").dqn.importance_exponent


@pytest.mark.parametrize("num_atoms", [1, 11])
def test_prioritized_update_writes_each_sampled_loss_back(num_atoms):
  """One prioritised update sets the priority of the transitions it drew to (loss + 1e-6)^α
  (Huber loss, or C51's cross-entropy), leaves every other leaf alone, and revives none."""
  cfg = deep_sea_config("dqn", prioritized=True, priority_exponent=0.5, num_atoms=num_atoms)
  state = filled_state(cfg)
  before = np.asarray(
      sum_tree.get_batch(state.replay.priority, jnp.arange(cfg.buffer_rows * cfg.num_envs))
  )
  assert before.max() == 1.0 and before.min() == 0.0  # new leaves enter at 1
  _, buf, metrics = jitted("update", cfg)(state.learner, state.replay, jax.random.PRNGKey(1))
  after = np.asarray(sum_tree.get_batch(buf.priority, jnp.arange(cfg.buffer_rows * cfg.num_envs)))

  @jax.jit
  def sampled_losses(learner, replay):
    batch = replay_lib.sample(
        replay,
        jax.random.PRNGKey(1),
        cfg.batch_size,
        cfg.n_step,
        cfg.gamma,
        importance_exponent=cfg.importance_exponent,
    )
    return batch, dqn.q_loss(cfg, learner.params, learner, batch, batch.reward)[1]

  batch, loss = sampled_losses(state.learner, state.replay)
  expect = before.copy()
  expect[np.asarray(batch.index)] = np.sqrt(np.asarray(loss["per_sample"]) + 1e-6)
  np.testing.assert_allclose(after, expect, rtol=1e-5)
  assert np.all(after[before == 0] == 0) and np.sum(after != before) > cfg.batch_size // 2
  assert np.isfinite(float(metrics["q_loss"]))
  state = state._replace(replay=buf)
  learned, _ = jitted("learn", cfg)(state)  # the on-device-cond path
  assert tree_changed(state.replay.priority, learned.replay.priority)


# ------------------------------------------------------------------------------------------
# Bonuses.


def test_csd_bonus_higher_for_unseen_than_replayed():
  """One-hot states (DeepSea's observations): fit CSD online on 30 'replayed' states; the 30
  never-seen ones keep a much larger variance."""
  d = 60
  eye = jnp.eye(d, dtype=jnp.float32)
  seen, unseen = eye[:30], eye[30:]
  b = novelty.csd(csd.CSD(prior=models.MLPSpec(widths=(256,), out_dim=1)))
  state = b.init(jax.random.PRNGKey(0), seen)
  update = jax.jit(b.update)
  key = jax.random.PRNGKey(1)
  for i in range(300):
    batch = seen[jax.random.randint(jax.random.fold_in(key, i), (32,), 0, 30)]
    state, m = update(state, batch)
  r_seen, r_unseen = b.score(state, seen), b.score(state, unseen)
  assert float(jnp.min(r_unseen)) > float(jnp.max(r_seen))
  assert float(jnp.mean(r_unseen)) > 5 * float(jnp.mean(r_seen))


def test_csd_bonus_decays_with_visit_count():
  """Online (DeepSea's optimizer, csd.lr 1): states replayed often lose their bonus first, states
  replayed rarely keep most of it, like a count-based bonus (docs/results.md has the same
  measured on DeepSea-20)."""
  d = 60
  eye = jnp.eye(d, dtype=jnp.float32)
  p = np.r_[np.full(10, 30.0), np.full(10, 1.0), np.zeros(40)]  # often, rarely, never
  b = bonus_lib.make("csd", models.MLPSpec(widths=(256,), out_dim=1), csd_lr=1.0)
  state = b.init(jax.random.PRNGKey(0), eye[:20])
  update = jax.jit(b.update)
  rng = np.random.default_rng(0)
  for _ in range(100):
    state, _ = update(state, eye[rng.choice(d, 64, p=p / p.sum())])
  r = np.asarray(b.score(state, eye))
  often, rarely, never = r[:10], r[10:20], r[20:]
  assert often.max() < rarely.min()
  assert rarely.mean() > 3 * often.mean()
  assert never.mean() > 0.7 * rarely.mean() > 0


def test_csd_bonus_pixels_higher_off_distribution():
  """Nature-style CNN prior on small images: replayed images vs images of another kind."""
  rng = np.random.default_rng(0)
  spec = models.CNNSpec(convs=((8, 4, 2), (8, 3, 2)), widths=(128,), padding="VALID", out_dim=1)
  base = rng.uniform(0, 0.3, (1, 16, 16, 3)).astype(np.float32)
  seen = jnp.asarray(base + rng.normal(0, 0.02, (64, 16, 16, 3)).astype(np.float32))
  other = jnp.asarray(rng.uniform(0.5, 1.0, (32, 16, 16, 3)).astype(np.float32))
  b = novelty.csd(csd.CSD(prior=spec))
  state = b.init(jax.random.PRNGKey(0), seen)
  update = jax.jit(b.update)
  for i in range(200):
    state, _ = update(state, seen[(np.arange(32) + 32 * i) % 64])
  assert float(jnp.median(b.score(state, other))) > 3 * float(jnp.median(b.score(state, seen[:32])))


def test_rnd_bonus_decreases_on_trained_inputs():
  eye = jnp.eye(40, dtype=jnp.float32)
  b = bonus_lib.make("rnd", networks.mlp_spec((32,), 1), rnd_lr=3e-3)
  state = b.init(jax.random.PRNGKey(0), eye[:20])
  before = b.score(state, eye[:20])
  update = jax.jit(b.update)
  for _ in range(300):
    state, _ = update(state, eye[:20])
  assert float(jnp.mean(b.score(state, eye[:20]))) < 0.3 * float(jnp.mean(before))
  assert float(jnp.mean(b.score(state, eye[20:]))) > float(jnp.mean(b.score(state, eye[:20])))


def test_bonus_floor_raises_the_centred_rewards_below_zero_to_zero():
  cfg = deep_sea_config("csd_sa", bonus_center=True)
  stats = bonus_lib.RunningStats(jnp.float32(1.0), jnp.float32(4.0), jnp.float32(1.0))
  raw = jnp.array([0.0, 1.0, 3.0])
  centred = dqn.normalized_bonus(cfg, stats, raw)
  assert float(centred[0]) < 0 < float(centred[2])
  floored = dqn.normalized_bonus(dataclasses.replace(cfg, bonus_floor=True), stats, raw)
  np.testing.assert_array_equal(floored, jnp.maximum(centred, 0.0))
  above = dataclasses.replace(cfg, bonus_floor=True, bonus_floor_std=1.0)
  np.testing.assert_array_equal(
      dqn.normalized_bonus(above, stats, raw), jnp.maximum(centred - 1.0, 0.0)
  )
  with pytest.raises(ValueError, match="bonus_floor needs bonus_center"):
    dataclasses.replace(cfg, bonus_center=False, bonus_floor=True)


def test_running_stats_normalise():
  stats = bonus_lib.init_stats()
  rng = np.random.default_rng(0)
  for _ in range(200):
    stats = bonus_lib.update_stats(stats, jnp.asarray(rng.normal(3.0, 2.0, 64)), jnp.ones(64))
  assert float(bonus_lib.scale(stats)) == pytest.approx(2.0, rel=0.2)
  assert float(bonus_lib.scale(bonus_lib.init_stats())) > 0


def test_preprocess_pixels_nhwc():
  obs = np.arange(2 * 12 * 3 * 4, dtype=np.uint8).reshape(2, 12, 3, 4)
  x = networks.preprocess(jnp.asarray(obs))
  assert x.shape == (2, 3, 4, 12) and x.dtype == jnp.float32
  np.testing.assert_allclose(np.asarray(x[1, 2, 3, 5]), obs[1, 5, 2, 3] / 255.0)


@pytest.mark.parametrize("act_on_target", [False, True])
def test_act_reads_the_online_or_the_target_heads(act_on_target):
  # no reward prior: at init the bonus's unnormalised scores would outweigh both heads
  cfg = deep_sea_config(
      "csd_sa", eps_start=0.0, eps_end=0.0, reward_prior=0.0, act_on_target=act_on_target
  )
  obs = jnp.eye(SIZE * SIZE, dtype=jnp.float32)
  state = dqn.init(cfg, jax.random.PRNGKey(0), obs[:E])
  learner = state.learner
  # online heads that differ from their target copies
  bump = lambda t: jax.tree.map(lambda p: p + 0.5 * jnp.sign(p), t)
  learner = learner._replace(
      params=bump(learner.params),
      intrinsic=learner.intrinsic._replace(params=bump(learner.intrinsic.params)),
  )
  heads = jnp.zeros(obs.shape[0], jnp.int32)
  acts = jitted("act", cfg)(learner, heads, obs, state.env_steps, jax.random.PRNGKey(1))
  x = networks.preprocess(obs)
  prior = jitted("reward_prior", cfg)(learner, x)
  for params, in_params, used in (
      (learner.params, learner.intrinsic.params, not act_on_target),
      (learner.target_params, learner.intrinsic.target_params, act_on_target),
  ):
    q = dqn.q_values(cfg, params, learner.prior_params, x)[:, 0]
    q = q + dqn.beta(cfg, state.env_steps) * jitted("intrinsic_q", cfg)(in_params, x, prior)
    if used:
      np.testing.assert_array_equal(acts, jnp.argmax(q, axis=-1))
    else:  # the bump changes some actions, so the test tells the two apart
      assert np.any(np.asarray(acts) != np.asarray(jnp.argmax(q, axis=-1)))


def test_steady_prior_reads_the_bonus_as_of_the_last_target_sync():
  cfg = deep_sea_config("csd_sa", steady_prior=True, target_sync_updates=3, learning_starts=0)
  obs = jnp.eye(SIZE * SIZE, dtype=jnp.float32)[:E]
  state = dqn.init(cfg, jax.random.PRNGKey(0), obs)
  same = lambda a, b: all(jax.tree.leaves(jax.tree.map(lambda x, y: bool(jnp.all(x == y)), a, b)))
  assert same(state.learner.intrinsic.bonus_target, state.learner.bonus_state)
  key = jax.random.PRNGKey(1)
  for t in range(E * 8):  # fill some replay rows
    state, _ = jitted("observe", cfg)(
        state,
        obs,
        jnp.zeros(E, jnp.int32),
        jnp.roll(obs, t + 1, axis=0),
        jnp.zeros(E),
        jnp.zeros(E, bool),
        jnp.zeros(E, bool),
        jnp.ones(E, bool),
    )
  learner, replay = state.learner, state.replay
  start = learner.intrinsic.bonus_target
  for n in (1, 2, 3):
    learner, replay, _ = jitted("update", cfg)(learner, replay, jax.random.fold_in(key, n))
    if n < 3:  # the bonus trains, its copy holds still until the sync
      assert same(learner.intrinsic.bonus_target, start)
      assert not same(learner.bonus_state, start)
  assert same(learner.intrinsic.bonus_target, learner.bonus_state)  # synced on update 3


def test_extra_head_shares_the_torso_and_its_pass():
  """``extra_outputs``: one dense head of K*A + E outputs on one torso; the main part reads as
  without it and the extra part is the last E columns."""
  net = networks.QNetwork(networks.mlp_spec((8,), 1), num_actions=3, num_heads=2, extra_outputs=4)
  x = jax.random.normal(jax.random.PRNGKey(0), (5, 6))
  params = net.init(jax.random.PRNGKey(1), x)
  main, extra = net.apply(params, x, with_extra=True)
  assert main.shape == (5, 2, 3) and extra.shape == (5, 4)
  np.testing.assert_array_equal(net.apply(params, x), main)
  head = params["params"]["net"]["head"]["kernel"]
  assert head.shape == (8, 2 * 3 + 4)
  with pytest.raises(ValueError, match="with_extra needs extra_outputs"):
    networks.QNetwork(networks.mlp_spec((8,), 1), 3).apply(
        networks.QNetwork(networks.mlp_spec((8,), 1), 3).init(jax.random.PRNGKey(1), x),
        x,
        with_extra=True,
    )
  with pytest.raises(ValueError, match="extra_outputs needs one shared torso"):
    networks.QNetwork(
        networks.mlp_spec((8,), 1), 3, num_heads=2, shared_torso=False, extra_outputs=3
    ).init(jax.random.PRNGKey(1), x)


def test_intrinsic_head_on_the_q_torso_takes_one_step_on_both_losses():
  """``intrinsic_shares_torso``: Q_in is the Q-net's extra head (no params of its own), one
  Adam step on q_loss + intrinsic_loss, and act reads Q_ext + β Q̂_in from that net."""
  cfg = deep_sea_config("csd_sa", intrinsic_shares_torso=True)
  state = filled_state(cfg)
  learner, replay = state.learner, state.replay
  assert learner.intrinsic.params == () and learner.intrinsic.opt_state == ()
  key = jax.random.PRNGKey(3)
  new, _, metrics = jitted("update", cfg)(learner, replay, key)

  @jax.jit
  def separate_passes(learner, replay, key):
    """The same step from the two losses, each with its own forward pass."""
    batch = dqn.sample_batch(cfg, replay, key, 0)
    raw, stats = dqn.intrinsic_rewards(cfg, learner, batch)
    ref = learner._replace(bonus_stats=stats)
    r_in = dqn.normalized_bonus(cfg, stats, raw)

    def both(p):
      ext, _ = dqn.q_loss(cfg, p, ref, batch, dqn.total_reward(cfg, batch, raw, stats, 0))
      intr, _ = dqn.intrinsic_loss(cfg, p, ref, batch, r_in)
      return ext + intr, (ext, intr)

    (_, (ext, intr)), grads = jax.value_and_grad(both, has_aux=True)(learner.params)
    params, _ = dqn.apply_gradients(
        cfg, dqn.q_network(cfg), learner.params, learner.opt_state, grads, batch.obs[:1]
    )
    return ext, intr, params

  ext, intr, params = separate_passes(learner, replay, key)
  np.testing.assert_allclose(metrics["q_loss"], ext, rtol=1e-5)
  np.testing.assert_allclose(metrics["int_loss"], intr, rtol=1e-5)
  assert float(intr) > 0
  for a, b in zip(jax.tree.leaves(new.params), jax.tree.leaves(params)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
  assert tree_changed(learner.params, new.params)
  obs = jnp.eye(SIZE * SIZE, dtype=jnp.float32)
  greedy = dataclasses.replace(cfg, eps_start=0.0, eps_end=0.0)
  acts = jitted("act", greedy)(new, jnp.zeros(obs.shape[0], jnp.int32), obs, 0, key)
  q_ext, prior, q_in = jitted("acting_values", greedy)(new, obs)
  np.testing.assert_allclose(
      q_in, dqn.q_network(cfg).apply(new.params, obs, with_extra=True)[1] + prior, rtol=1e-6
  )
  np.testing.assert_array_equal(acts, jnp.argmax(q_ext[:, 0] + dqn.beta(cfg, 0) * q_in, -1))
  with pytest.raises(ValueError, match="intrinsic_shares_torso needs a state-action"):
    deep_sea_config("dqn", intrinsic_shares_torso=True)
