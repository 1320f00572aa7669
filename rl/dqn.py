"""DQN with a pluggable intrinsic bonus, and bootstrapped DQN with randomised priors: one learner.

Read top to bottom, like a cleanrl script, but as pure functions of pytrees:

* ``rl.dqn_config.Config``: every hyper-parameter (hashable; the static argument of the jitted
  functions; plain data, in a module of its own so that configs read its defaults without JAX).
  ``agent`` picks the variant: ``dqn`` (ε-greedy), ``csd`` / ``rnd`` (DQN + intrinsic bonus,
  ``rl.bonus``), ``bdqn`` (BDQN+P: K heads with additive fixed random priors, bootstrap masks,
  one head sampled per episode; Osband et al. 2018), ``csd_sa`` / ``rnd_sa`` (the CSD paper's
  agent: the bonus of state-action pairs r_in(s, a), deep CSD or RND, trains a separate
  intrinsic value head (``intrinsic_shares_torso``: a second head on Q_ext's torso, trained in
  Q_ext's step; ``intrinsic_pool``: the Q-net's architecture on average-pooled frames) whose
  forward pass adds the reward prior,
  Q̂_in = Q_in + reward_prior · r_in(s, ·), discounted by its own ``intrinsic_gamma``;
  actions are greedy in Q_ext + β Q̂_in, with β decayed linearly; Q_ext sees r_ext only).
  ``num_atoms`` > 1 makes Q_ext a C51 distribution (the paper's CSD and RND agents).
* ``init(cfg, key, obs_example) -> AgentState``: params, target params, frozen prior params,
  Adam state, bonus state, bonus running stats, the replay buffer (``rl.replay``, on device),
  the acting head of each env, step counters and the PRNG key. The whole state is one pytree
  (checkpointed as is by the drivers ``rl.deepsea`` and ``rl.vizdoom``).
* ``update(cfg, learner, replay, key)``: ONE jitted function: samples an n-step batch
  (``prioritized``: in proportion to priority, with importance weights; the batch's per-sample
  Q_ext losses are written back as its priorities, and the replay is returned), computes
  the bonus of the next observations, the double-DQN Huber loss over all heads (weighted by the
  bootstrap masks and the valid weights; C51's cross-entropy instead), one Adam step with
  global-norm clipping, the periodic target sync, and one training step of the bonus on the
  batch's next observations (with ``context_augment``, CSD's contexts are those inputs, each
  augmented with that probability).
  ``update`` composes those steps, each a function of its own: ``sample_batch``,
  ``intrinsic_rewards``, ``total_reward``, ``extrinsic_step``, ``write_priorities``,
  ``sync_targets``, ``intrinsic_step`` (state_action) and ``bonus_step``.
* ``observe(cfg, state, obs, actions, next_obs, reward, done, terminated, valid)``: after every
  vectorised env step: writes the row to replay, resamples the head of envs whose episode
  ended, picks the next actions. ``learn(cfg, state)``: ``updates_per_step`` calls of
  ``update`` once ``learning_starts`` env steps were collected, on every ``update_period``-th
  vectorised step. ``step`` = observe + learn.
  The VizDoom driver (``rl.vizdoom``) jits observe and learn separately and calls them from Python
  around the envpool step (so the env steps while the device learns); the DeepSea driver
  (``rl.deepsea``) runs ``step`` inside ``lax.scan`` beside the JAX env (``make_chunk``). Same
  functions, same learner.

The total reward in the targets is ``r_ext + bonus_coef * (r_int - m) / running_std(r_int)``
with m = 0, or the running mean with ``bonus_center`` (then familiar observations give negative
intrinsic reward, so the untried actions of a visited state, whose Q stays near its small init,
look better than the tried ones: without it a greedy bonus agent is *pessimistic* about untried
actions, which on DeepSea cost hundreds of episodes at the first cell). r_int is the bonus of the
next observation, recomputed at update time with the current bonus state (``bonus_at_update``,
default for small observations) or computed once at collection and stored in replay (for
pixels: no n-fold pixel gather per update). The state-action bonus on pooled frames is
recomputed at update time from pooled frames that replay stores once per step
(``stores_bonus_features``), so no window pools a frame stack again. The bonus trains on the
batch's next observations; with ``bonus_recent_rows`` half of its batch comes from the newest
replay rows instead, so the novelty of a just-visited observation fades within a few updates
rather than after it has become a sizeable fraction of a large buffer.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from csd_jax import models
from csd_jax import parallel
from rl import bonus as bonus_lib
from rl import dqn_config
from rl import networks
from rl import replay as replay_lib
from uncertainty_kit import augment as augment_lib

Array = jax.Array
PyTree = Any


class Learner(NamedTuple):
  params: PyTree
  target_params: PyTree
  prior_params: PyTree  # frozen; used with prior_scale (0 for all but bdqn)
  opt_state: PyTree
  bonus_state: PyTree
  bonus_stats: bonus_lib.RunningStats
  updates: Array  # () int32
  intrinsic: PyTree = ()  # state_action: IntrinsicHead; () otherwise


class IntrinsicHead(NamedTuple):
  """The separate value function of the intrinsic reward (state_action form). With
  ``intrinsic_shares_torso`` its params, target and optimizer state are () (the head lives in
  ``Learner.params``; ``intrinsic_params``)."""

  params: PyTree
  target_params: PyTree
  opt_state: PyTree
  bonus_target: PyTree = ()  # steady_prior: the bonus state the bootstrap's prior reads


class AgentState(NamedTuple):
  learner: Learner
  replay: replay_lib.Replay
  heads: Array  # (E,) int32, the head each env acts with this episode
  env_steps: Array  # () int32, env steps summed over envs (includes auto-reset steps)
  key: Array  # raw uint32 PRNG key


# ------------------------------------------------------------------------------------------
# Pieces (cached per config, so every jit sees the same closures).


@functools.lru_cache(maxsize=64)
def q_network(cfg: dqn_config.Config) -> networks.QNetwork:
  """Q_ext's net; with ``intrinsic_shares_torso`` it also carries the intrinsic head (an extra
  head of A values on its torso)."""
  extra = cfg.num_actions if cfg.intrinsic_shares_torso else 0
  return networks.QNetwork(
      cfg.q_spec, cfg.num_actions, cfg.num_heads, cfg.shared_torso, cfg.num_atoms, extra
  )


@functools.lru_cache(maxsize=64)
def optimizer(cfg: dqn_config.Config) -> optax.GradientTransformation:
  return optax.chain(
      optax.clip_by_global_norm(cfg.max_grad_norm), optax.adam(cfg.learning_rate, eps=cfg.adam_eps)
  )


def pooled_frames(x: Array, factor: int) -> Array:
  """Preprocessed frames (B, H, W, C) average-pooled by ``factor``: (B, H // factor,
  W // factor, C); x as given when ``factor`` is 1 or x is not frames. A composite factor pools
  by its prime factors in turn, largest first (the same windows: XLA:CPU pools 320 frames of
  42x42x6 by 6 in ~7 ms at once, by 3 then 2 in ~4 ms)."""
  if factor <= 1 or x.ndim != 4:
    return x
  for p in _prime_factors(factor):
    x = nn.avg_pool(x, (p, p), strides=(p, p), padding="VALID")
  return x


def pooled(x: Array, factor: int) -> Array:
  """``pooled_frames`` flattened: (B, (H // factor) * (W // factor) * C), what the bonus's MLPs
  read; x as given when ``factor`` is 1 or x is not frames."""
  if factor <= 1 or x.ndim != 4:
    return x
  x = pooled_frames(x, factor)
  return x.reshape((x.shape[0], -1))


def _prime_factors(n: int) -> list[int]:
  """n's prime factors with multiplicity, largest first (12 -> [3, 2, 2])."""
  out, p = [], 2
  while p * p <= n:
    while n % p == 0:
      out.append(p)
      n //= p
    p += 1
  return sorted(out + [n] * (n > 1), reverse=True)


@functools.lru_cache(maxsize=64)
def intrinsic_network(cfg: dqn_config.Config) -> networks.QNetwork:
  """The intrinsic head's own net (state_action form without ``intrinsic_shares_torso``): the
  Q-net's architecture, on ``intrinsic_inputs``."""
  return networks.QNetwork(cfg.q_spec, cfg.num_actions, 1, True)


def intrinsic_inputs(cfg: dqn_config.Config, x: Array) -> Array:
  """What the intrinsic head's own net reads of preprocessed frames x: x average-pooled by
  ``intrinsic_pool`` (``pooled_frames``; its convs then run on frames that many times
  smaller on each side)."""
  return pooled_frames(x, cfg.intrinsic_pool)


def intrinsic_values(cfg: dqn_config.Config, params: PyTree, x: Array) -> Array:
  """Q_in(s, ·) at preprocessed x: (B, A). ``params``: the intrinsic head's own
  (``intrinsic_params``), or with ``intrinsic_shares_torso`` Q_ext's, whose extra head it is."""
  if cfg.intrinsic_shares_torso:
    return q_network(cfg).apply(params, x, with_extra=True)[1]
  return intrinsic_network(cfg).apply(params, intrinsic_inputs(cfg, x))[:, 0]


def intrinsic_params(cfg: dqn_config.Config, learner: Learner, target: bool = False) -> PyTree:
  """The params that ``intrinsic_values`` reads: online or ``target`` copies."""
  if cfg.intrinsic_shares_torso:
    return learner.target_params if target else learner.params
  return learner.intrinsic.target_params if target else learner.intrinsic.params


@functools.lru_cache(maxsize=64)
def bonus_fns(cfg: dqn_config.Config) -> bonus_lib.Bonus:
  return bonus_lib.make(
      cfg.bonus_kind,
      cfg.bonus_spec,
      rnd_dim=cfg.rnd_dim,
      rnd_lr=cfg.rnd_lr,
      csd_lr=cfg.csd_lr,
      csd_towers=cfg.csd_towers,
      csd_embed_dim=cfg.csd_embed_dim,
  )


def bonus_inputs(
    cfg: dqn_config.Config, x: Array, actions: Array | None = None
) -> Array | models.OneHotProduct:
  """What the bonus scores: the observations ``x`` (next_obs form); with ``actions`` (B,) the
  pairs (x_b, a_b), without them every (x_b, a) (B * A rows, ``bonus_lib.all_pairs``;
  state_action form). Images
  (B, H, W, C) are average-pooled by ``bonus_pool`` and flattened first when it is > 1."""
  x = pooled(x, cfg.bonus_pool)
  if not cfg.state_action:
    return x
  if actions is None:
    return bonus_lib.all_pairs(x, cfg.num_actions)
  return bonus_lib.pair_inputs(x, actions, cfg.num_actions)


def bonus_features(cfg: dqn_config.Config, x: Array) -> Array:
  """What replay stores of preprocessed frames x (B, H, W, C) for the state-action bonus
  (``stores_bonus_features``): x pooled by ``bonus_pool`` and flattened, (B, D); the pairs
  are then ``bonus_lib.pair_inputs`` of these rows, as ``bonus_inputs`` builds them."""
  return pooled(x, cfg.bonus_pool)


def beta(cfg: dqn_config.Config, env_steps: Array) -> Array:
  """The bonus weight: linear from ``bonus_coef`` to ``bonus_coef_end`` over
  ``bonus_decay_steps`` env steps, or ``bonus_coef`` throughout."""
  if cfg.bonus_decay_steps <= 0:
    return jnp.asarray(cfg.bonus_coef, jnp.float32)
  frac = jnp.clip(env_steps / cfg.bonus_decay_steps, 0.0, 1.0)
  return cfg.bonus_coef + frac * (cfg.bonus_coef_end - cfg.bonus_coef)


def normalized_bonus(cfg: dqn_config.Config, stats: bonus_lib.RunningStats, raw: Array) -> Array:
  """(raw − m) / running std, m the running mean with ``bonus_center`` (else 0): centred,
  familiar inputs get negative rewards, so a path of them is worth less than an untried
  action. ``bonus_floor`` measures them from ``bonus_floor_std`` stds above the mean and
  raises those below to 0: familiar inputs then pay the same (nothing) wherever they are, and
  only inputs rarer than that pay."""
  r = bonus_lib.normalize(stats, raw - (stats.mean if cfg.bonus_center else 0.0))
  return jnp.maximum(r - cfg.bonus_floor_std, 0.0) if cfg.bonus_floor else r


def reward_prior(cfg: dqn_config.Config, learner: Learner, x: Array) -> Array:
  """reward_prior · r_in(s, a) of every action at preprocessed x: (B, A), r_in the bonus of
  (s, a) normalised as the intrinsic rewards are (``normalized_bonus``; no gradient)."""
  raw = bonus_fns(cfg).score(learner.bonus_state, bonus_inputs(cfg, x))
  r = normalized_bonus(cfg, learner.bonus_stats, raw).reshape((x.shape[0], cfg.num_actions))
  return cfg.reward_prior * jax.lax.stop_gradient(r)


def intrinsic_q(cfg: dqn_config.Config, params: PyTree, x: Array, prior: Array) -> Array:
  """Q̂_in(s, ·) = Q_in(s, ·) + ``prior`` (``reward_prior`` of x): (B, A). An action never
  tried at s keeps its high prior reward, so it looks valuable before it was tried (the
  intrinsic reward prior of Zanger et al. 2024)."""
  return intrinsic_values(cfg, params, x) + prior


def atoms(cfg: dqn_config.Config) -> Array:
  """C51's support: (num_atoms,) values evenly spaced on [v_min, v_max]."""
  return jnp.linspace(cfg.v_min, cfg.v_max, cfg.num_atoms, dtype=jnp.float32)


def c51_mean(cfg: dqn_config.Config, logits: Array) -> Array:
  """The mean of C51 distributions given by their atom ``logits`` (..., N): (...)."""
  return jnp.sum(jax.nn.softmax(logits, axis=-1) * atoms(cfg), axis=-1)


def q_values(
    cfg: dqn_config.Config, params: PyTree, prior_params: PyTree, x: Array, out: Array | None = None
) -> Array:
  """Q(s) = Q_θ(s) + β Q_prior(s) for preprocessed x: (B, K, A); with C51 the mean of each
  action's distribution. ``out``: Q_θ's net output at x, when the caller has it."""
  net = q_network(cfg)
  q = net.apply(params, x) if out is None else out
  if cfg.num_atoms > 1:
    return c51_mean(cfg, q)
  if cfg.prior_scale:
    q = q + cfg.prior_scale * jax.lax.stop_gradient(net.apply(prior_params, x))
  return q


def importance_exponent(cfg: dqn_config.Config, env_steps: Array) -> Array:
  """β_IS: linear from ``importance_exponent`` to 1 over ``importance_anneal_steps`` env steps
  (Schaul et al. 2016), or constant."""
  if cfg.importance_anneal_steps <= 0:
    return jnp.asarray(cfg.importance_exponent, jnp.float32)
  frac = jnp.clip(env_steps / cfg.importance_anneal_steps, 0.0, 1.0)
  return cfg.importance_exponent + frac * (1.0 - cfg.importance_exponent)


def epsilon(cfg: dqn_config.Config, env_steps: Array) -> Array:
  frac = jnp.clip(env_steps / max(1, cfg.eps_decay_steps), 0.0, 1.0)
  return cfg.eps_start + frac * (cfg.eps_end - cfg.eps_start)


# ------------------------------------------------------------------------------------------
# State.


@functools.partial(jax.jit, static_argnums=0)
def init(cfg: dqn_config.Config, key: Array, obs_example: Array) -> AgentState:
  """Initial agent state (jitted). ``obs_example``: raw observations (B, *obs_shape), e.g. the
  first ones from env.reset(). ``key``: a raw uint32 PRNG key (``jax.random.PRNGKey``)."""
  k_q, k_prior, k_bonus, k_heads, k_next = jax.random.split(key, 5)
  x = networks.preprocess(jnp.asarray(obs_example))
  net = q_network(cfg)
  params = net.init(k_q, x[:1])
  prior_params = net.init(k_prior, x[:1]) if cfg.prior_scale else {}
  intrinsic = ()
  pairs = bonus_inputs(cfg, x)
  example = models.as_array(pairs)
  if isinstance(pairs, models.OneHotProduct):
    # The barrier keeps XLA from fusing the materialised pairs into the one-hot gathers'
    # argmax: that fusion sends LLVM's loop vectorizer (VPlan's recursive isSingleScalar)
    # into exponential time at -O1 and above on XLA:CPU (jaxlib 0.10.2): minutes on DeepSea-5.
    example = jax.lax.optimization_barrier(example)
  bonus_state = bonus_fns(cfg).init(k_bonus, example)
  if cfg.state_action:
    bonus_target = jax.tree.map(jnp.copy, bonus_state) if cfg.steady_prior else ()
    if cfg.intrinsic_shares_torso:  # its params are Q_ext's
      intrinsic = IntrinsicHead((), (), (), bonus_target)
    else:
      int_params = intrinsic_network(cfg).init(
          jax.random.fold_in(k_q, 1), intrinsic_inputs(cfg, x[:1])
      )
      intrinsic = IntrinsicHead(
          int_params,
          jax.tree.map(jnp.copy, int_params),
          optimizer(cfg).init(int_params),
          bonus_target,
      )
  learner = Learner(
      params=params,
      target_params=jax.tree.map(jnp.copy, params),
      prior_params=prior_params,
      opt_state=optimizer(cfg).init(params),
      bonus_state=bonus_state,
      bonus_stats=bonus_lib.init_stats(),
      updates=jnp.zeros((), jnp.int32),
      intrinsic=intrinsic,
  )
  buf = replay_lib.init(
      cfg.buffer_rows,
      cfg.num_envs,
      cfg.obs_shape,
      jnp.dtype(cfg.obs_dtype),
      cfg.num_heads,
      prioritized=cfg.prioritized,
      feature_dim=bonus_features(cfg, x[:1]).shape[-1] if cfg.stores_bonus_features else 0,
  )
  heads = jax.random.randint(k_heads, (cfg.num_envs,), 0, cfg.num_heads)
  return AgentState(learner, buf, heads, jnp.zeros((), jnp.int32), k_next)


# ------------------------------------------------------------------------------------------
# Acting.


def acting_values(
    cfg: dqn_config.Config, learner: Learner, x: Array
) -> tuple[Array, Array | None, Array | None]:
  """What ``act`` maximises, by parts, at preprocessed x: Q_ext (B, K, A), and in the
  state_action form the reward prior (B, A) and Q̂_in (B, A) (else None, None); the online
  heads, or with ``act_on_target`` their target copies. ``act`` takes Q_ext + β Q̂_in."""
  target = cfg.act_on_target
  q = q_values(cfg, learner.target_params if target else learner.params, learner.prior_params, x)
  if not cfg.state_action:
    return q, None, None
  prior = reward_prior(cfg, learner, x)
  return q, prior, intrinsic_q(cfg, intrinsic_params(cfg, learner, target), x, prior)


def act(
    cfg: dqn_config.Config, learner: Learner, heads: Array, obs: Array, env_steps: Array, key: Array
) -> Array:
  """ε-greedy actions (E,) w.r.t. each env's head (state_action form: w.r.t.
  Q_ext + β Q̂_in; ``acting_values``)."""
  q, _, q_in = acting_values(cfg, learner, networks.preprocess(obs))
  q = jnp.take_along_axis(q, heads[:, None, None], axis=1)[:, 0]  # (E, A)
  if q_in is not None:
    q = q + beta(cfg, env_steps) * q_in
  k_explore, k_random = jax.random.split(key)
  explore = jax.random.uniform(k_explore, heads.shape) < epsilon(cfg, env_steps)
  random = jax.random.randint(k_random, heads.shape, 0, cfg.num_actions)
  return jnp.where(explore, random, jnp.argmax(q, axis=-1)).astype(jnp.int32)


# ------------------------------------------------------------------------------------------
# Learning.


def _intrinsic(cfg: dqn_config.Config, learner: Learner, batch: replay_lib.Batch) -> Array:
  """Raw intrinsic rewards (B, n) of the n steps: the bonus of the next observations
  obs_{t+1..t+n}, or (state_action) of the pairs (obs_{t+i}, a_{t+i}) taken."""
  if cfg.bonus_kind == "none":
    return jnp.zeros_like(batch.reward)
  if not cfg.bonus_at_update:
    return batch.bonus
  b, n = batch.reward.shape
  if cfg.stores_bonus_features:
    x = bonus_lib.pair_inputs(
        batch.feature_seq.reshape((b * n, -1)), batch.action_seq.reshape(b * n), cfg.num_actions
    )
  elif cfg.state_action:
    seq = jnp.concatenate([batch.obs[:, None], batch.next_obs_seq[:, :-1]], axis=1)
    x = bonus_inputs(
        cfg,
        networks.preprocess(seq.reshape((b * n, *cfg.obs_shape))),
        batch.action_seq.reshape(b * n),
    )
  else:
    x = networks.preprocess(batch.next_obs_seq.reshape((b * n, *cfg.obs_shape)))
  r = bonus_fns(cfg).score(learner.bonus_state, x)
  return jax.lax.stop_gradient(r.reshape((b, n)))


def q_loss(
    cfg: dqn_config.Config,
    params: PyTree,
    learner: Learner,
    batch: replay_lib.Batch,
    total_reward: Array,
    out: Array | None = None,
) -> tuple[Array, dict]:
  """Double-DQN n-step Huber loss, averaged over valid (sample, head) pairs; with C51 the
  categorical double-Q loss (``c51_loss``). ``out``: the net's output at the batch's
  observations under ``params``, when the caller has it."""
  x, xb = networks.preprocess(batch.obs), networks.preprocess(batch.boot_obs)
  discounts = cfg.gamma ** jnp.arange(cfg.n_step, dtype=jnp.float32)
  ret = jnp.sum(batch.step_mask * discounts * total_reward, axis=1)  # (B,)
  if cfg.num_atoms > 1:
    return c51_loss(cfg, params, learner, batch, ret, x, xb, out)
  q_next_online = q_values(cfg, params, learner.prior_params, xb)  # (B, K, A)
  q_next_target = q_values(cfg, learner.target_params, learner.prior_params, xb)
  a_star = jnp.argmax(q_next_online, axis=-1)
  boot = jnp.take_along_axis(q_next_target, a_star[..., None], axis=-1)[..., 0]  # (B, K)
  target = jax.lax.stop_gradient(ret[:, None] + batch.boot_discount[:, None] * boot)
  q = q_values(cfg, params, learner.prior_params, x, out)
  q_a = jnp.take_along_axis(q, batch.action[:, None, None], axis=-1)[..., 0]  # (B, K)
  mask = batch.mask.astype(jnp.float32)
  w = batch.weight[:, None] * mask
  huber = optax.huber_loss(q_a, target, delta=1.0)
  loss = jnp.sum(w * huber) / jnp.maximum(jnp.sum(w), 1.0)
  per_sample = jnp.sum(mask * huber, axis=1) / jnp.maximum(jnp.sum(mask, axis=1), 1.0)
  return loss, {
      "q_loss": loss,
      "q_mean": jnp.mean(q_a),
      "target_mean": jnp.mean(target),
      "per_sample": jax.lax.stop_gradient(per_sample),
  }


def categorical_projection(z: Array, probs: Array, target_z: Array) -> Array:
  """C51's projection (Bellemare et al. 2017, Alg. 1): the distribution with masses ``probs``
  (B, N) on the shifted atoms ``target_z`` (B, N), clipped to [z_0, z_{N-1}] and split between
  the two nearest atoms of the evenly spaced support ``z`` (N,) in proportion to closeness:
  (B, N) masses on ``z``."""
  b = (jnp.clip(target_z, z[0], z[-1]) - z[0]) / (z[1] - z[0])  # (B, N) in [0, N-1]
  hat = jnp.clip(1.0 - jnp.abs(b[:, :, None] - jnp.arange(z.shape[0])), 0.0, 1.0)  # (B, N, N)
  return jnp.einsum("bi,bij->bj", probs, hat)


def c51_loss(
    cfg: dqn_config.Config,
    params: PyTree,
    learner: Learner,
    batch: replay_lib.Batch,
    ret: Array,
    x: Array,
    xb: Array,
    out: Array | None = None,
) -> tuple[Array, dict]:
  """C51 on n-step returns ``ret`` (B,): the cross-entropy between the distribution of
  (s_t, a_t) and the target net's distribution at the bootstrap state's online-greedy action
  (double DQN), shifted by ``ret``, scaled by the bootstrap discount and projected on the atoms
  (``categorical_projection``); averaged over valid samples. ``x``, ``xb``: the preprocessed
  observations and bootstrap observations; ``out``: the net's logits at x, when the caller has
  them."""
  net, z = q_network(cfg), atoms(cfg)
  logits = (net.apply(params, x) if out is None else out)[:, 0]  # (B, A, N)
  logits_next = net.apply(learner.target_params, xb)[:, 0]
  a_star = jnp.argmax(q_values(cfg, params, learner.prior_params, xb)[:, 0], axis=-1)
  pick = lambda l, a: jnp.take_along_axis(l, a[:, None, None], axis=1)[:, 0]  # (B, N)
  p_next = jax.nn.softmax(pick(logits_next, a_star), axis=-1)
  target = jax.lax.stop_gradient(
      categorical_projection(z, p_next, ret[:, None] + batch.boot_discount[:, None] * z)
  )
  per_sample = -jnp.sum(target * jax.nn.log_softmax(pick(logits, batch.action)), axis=-1)
  w = batch.weight
  loss = jnp.sum(w * per_sample) / jnp.maximum(jnp.sum(w), 1.0)
  boot = c51_mean(cfg, pick(logits_next, a_star))
  return loss, {
      "q_loss": loss,
      "q_mean": jnp.mean(c51_mean(cfg, pick(logits, batch.action))),
      "target_mean": jnp.mean(ret + batch.boot_discount * boot),
      "per_sample": jax.lax.stop_gradient(per_sample),
  }


def intrinsic_loss(
    cfg: dqn_config.Config,
    params: PyTree,
    learner: Learner,
    batch: replay_lib.Batch,
    reward: Array,
    q_in: Array | None = None,
) -> tuple[Array, dict]:
  """Double-DQN n-step Huber loss of the intrinsic head Q̂_in on ``reward`` (B, n), the
  normalised intrinsic rewards of the steps (state_action form). ``params``: what
  ``intrinsic_values`` reads; ``q_in``: Q_in at the batch's observations (B, A), when the
  caller has it. The reward prior of the replayed pair (s_t, a_t) is ``reward[:, 0]``'s (the
  same bonus, the same normalisation), so only the bootstrap states score every action. The
  head discounts by ``intrinsic_discount``: the prior of the best action at every bootstrap
  state adds about prior · γⁿ/(1 − γⁿ) to Q̂_in (33× at γ 0.997, n 10; 9× at 0.99), which β
  must keep below the extrinsic values' spread."""
  x, xb = networks.preprocess(batch.obs), networks.preprocess(batch.boot_obs)
  gamma = cfg.intrinsic_discount
  ret = jnp.sum(
      batch.step_mask * gamma ** jnp.arange(cfg.n_step, dtype=jnp.float32) * reward, axis=1
  )
  # the replayed bootstrap discount is gamma^m (0 at a terminal); redone with the head's own γ
  boot_discount = jnp.where(batch.boot_discount > 0, gamma ** jnp.sum(batch.step_mask, axis=1), 0.0)
  if cfg.steady_prior:  # the bonus as of the last target sync
    prior_b = reward_prior(cfg, learner._replace(bonus_state=learner.intrinsic.bonus_target), xb)
  else:
    prior_b = reward_prior(cfg, learner, xb)
  a_star = jnp.argmax(intrinsic_q(cfg, params, xb, prior_b), axis=-1)
  boot = jnp.take_along_axis(
      intrinsic_q(cfg, intrinsic_params(cfg, learner, target=True), xb, prior_b),
      a_star[:, None],
      axis=-1,
  )[:, 0]
  target = jax.lax.stop_gradient(ret + boot_discount * boot)
  q_in = intrinsic_values(cfg, params, x) if q_in is None else q_in
  q_a = jnp.take_along_axis(q_in, batch.action[:, None], axis=-1)[
      :, 0
  ] + cfg.reward_prior * jax.lax.stop_gradient(reward[:, 0])
  w = batch.weight
  loss = jnp.sum(w * optax.huber_loss(q_a, target, delta=1.0)) / jnp.maximum(jnp.sum(w), 1.0)
  return loss, {"int_loss": loss, "int_q_mean": jnp.mean(q_a), "int_target_mean": jnp.mean(target)}


def sample_batch(
    cfg: dqn_config.Config, buf: replay_lib.Replay, key: Array, env_steps: Array | int
) -> replay_lib.Batch:
  """The update's n-step batch of ``cfg.batch_size`` transitions (``prioritized``: drawn in
  proportion to priority, with importance weights annealed by ``importance_exponent``), laid
  out over the mesh. The next observations of the n steps (or, with ``stores_bonus_features``,
  the steps' stored features) come along when the bonus is recomputed at update time."""
  batch = replay_lib.sample(
      buf,
      key,
      cfg.batch_size,
      cfg.n_step,
      cfg.gamma,
      with_next_obs_seq=(
          cfg.bonus_kind != "none" and cfg.bonus_at_update and not cfg.stores_bonus_features
      ),
      importance_exponent=importance_exponent(cfg, env_steps),
      with_feature_seq=cfg.stores_bonus_features,
  )
  return parallel.constrain_batch(cfg.mesh, batch)


def intrinsic_rewards(
    cfg: dqn_config.Config, learner: Learner, batch: replay_lib.Batch
) -> tuple[Array, bonus_lib.RunningStats]:
  """The raw intrinsic rewards (B, n) of the batch's steps (``_intrinsic``), and the bonus's
  running stats updated with them (valid steps, weighted by the importance weights)."""
  raw = _intrinsic(cfg, learner, batch)
  stats = learner.bonus_stats
  if cfg.bonus_kind != "none":
    stats = bonus_lib.update_stats(stats, raw, batch.step_mask * batch.weight[:, None])
  return raw, stats


def total_reward(
    cfg: dqn_config.Config,
    batch: replay_lib.Batch,
    raw: Array,
    stats: bonus_lib.RunningStats,
    env_steps: Array | int,
) -> Array:
  """The rewards (B, n) Q_ext learns from: r_ext + β · the normalised intrinsic reward, or
  r_ext alone in the state_action form (there β weighs the two heads when acting)."""
  if cfg.state_action:
    return batch.reward
  return batch.reward + beta(cfg, env_steps) * normalized_bonus(cfg, stats, raw)


def apply_gradients(
    cfg: dqn_config.Config,
    net: networks.QNetwork,
    params: PyTree,
    opt_state: PyTree,
    grads: PyTree,
    one_obs: Array,
) -> tuple[PyTree, PyTree]:
  """One Adam step with global-norm clipping (``optimizer``): (params, opt_state). The
  spectral-norm vectors (batch_stats) get zero gradients, so Adam leaves them; they move here,
  by one power iteration of ``net`` on ``one_obs`` (1, ...), a preprocessed observation."""
  updates, opt_state = optimizer(cfg).update(grads, opt_state, params)
  params = networks.refresh_spectral_norm(net, optax.apply_updates(params, updates), one_obs)
  return params, opt_state


def extrinsic_step(
    cfg: dqn_config.Config,
    learner: Learner,
    batch: replay_lib.Batch,
    reward: Array,
    one_obs: Array,
    int_reward: Array | None = None,
) -> tuple[PyTree, PyTree, dict, Array]:
  """One gradient step of Q_ext (all heads) on ``q_loss`` with the rewards ``reward`` (B, n):
  (params, opt_state, metrics with the gradient's global norm, per-sample losses (B,)).
  With ``intrinsic_shares_torso``, of the intrinsic head too: ``intrinsic_loss`` on
  ``int_reward`` (B, n), the normalised intrinsic rewards, added to ``q_loss``, both heads
  read from one pass of the torso over the batch."""

  def loss(p):
    if not cfg.intrinsic_shares_torso:
      return q_loss(cfg, p, learner, batch, reward)
    out, q_in = q_network(cfg).apply(p, networks.preprocess(batch.obs), with_extra=True)
    ext, ext_metrics = q_loss(cfg, p, learner, batch, reward, out)
    intr, int_metrics = intrinsic_loss(cfg, p, learner, batch, int_reward, q_in)
    return ext + intr, {**ext_metrics, **int_metrics}

  (_, metrics), grads = jax.value_and_grad(loss, has_aux=True)(learner.params)
  per_sample = metrics.pop("per_sample")
  params, opt_state = apply_gradients(
      cfg, q_network(cfg), learner.params, learner.opt_state, grads, one_obs
  )
  return params, opt_state, dict(metrics, grad_norm=optax.global_norm(grads)), per_sample


def write_priorities(
    cfg: dqn_config.Config, buf: replay_lib.Replay, batch: replay_lib.Batch, per_sample: Array
) -> replay_lib.Replay:
  """The replay with the batch's priorities p_i = (loss_i + 1e-6)^α, loss_i Q_ext's per-sample
  loss (C51: its cross-entropy), (B,); without ``prioritized`` the replay as given."""
  if not cfg.prioritized:
    return buf
  return replay_lib.update_priorities(
      buf, batch.index, (per_sample + 1e-6) ** cfg.priority_exponent
  )


def sync_targets(
    cfg: dqn_config.Config, updates: Array, params: PyTree, target_params: PyTree
) -> PyTree:
  """The target params after update number ``updates`` (counting this one): ``params`` on
  every ``target_sync_updates``-th update, else ``target_params`` unchanged."""
  sync = updates % cfg.target_sync_updates == 0
  return jax.tree.map(lambda p, t: jnp.where(sync, p, t), params, target_params)


def intrinsic_step(
    cfg: dqn_config.Config,
    learner: Learner,
    batch: replay_lib.Batch,
    raw: Array,
    stats: bonus_lib.RunningStats,
    one_obs: Array,
) -> tuple[PyTree, PyTree, dict]:
  """One gradient step of the intrinsic head Q̂_in (state_action form) on ``intrinsic_loss``
  with the raw intrinsic rewards ``raw`` (B, n) normalised by the updated ``stats``:
  (params, opt_state, metrics)."""
  head = learner.intrinsic
  (_, metrics), grads = jax.value_and_grad(
      lambda p: intrinsic_loss(
          cfg, p, learner._replace(bonus_stats=stats), batch, normalized_bonus(cfg, stats, raw)
      ),
      has_aux=True,
  )(head.params)
  params, opt_state = apply_gradients(
      cfg,
      intrinsic_network(cfg),
      head.params,
      head.opt_state,
      grads,
      intrinsic_inputs(cfg, one_obs),
  )
  return params, opt_state, metrics


def bonus_training_inputs(
    cfg: dqn_config.Config, batch: replay_lib.Batch, buf: replay_lib.Replay, key: Array
) -> tuple[Array, Array | None]:
  """What the bonus trains on: (raw observations (B, *obs_shape), actions (B,) or None). The
  batch's next observations (state_action: its (obs, action) pairs); with
  ``bonus_recent_rows``, half of them come from the newest replay rows instead, drawn with
  ``key``."""
  obs, actions = (batch.obs, batch.action) if cfg.state_action else (batch.next_obs, None)
  if cfg.bonus_kind != "none" and cfg.bonus_recent_rows > 0:
    half = cfg.batch_size // 2
    keep = cfg.batch_size - half
    r_obs, r_actions, r_next = replay_lib.sample_recent(buf, key, half, cfg.bonus_recent_rows)
    if cfg.state_action:
      obs = jnp.concatenate([obs[:keep], r_obs])
      actions = parallel.constrain_batch(cfg.mesh, jnp.concatenate([actions[:keep], r_actions]))
    else:
      obs = jnp.concatenate([obs[:keep], r_next])
    obs = parallel.constrain_batch(cfg.mesh, obs)
  return obs, actions


def bonus_step(
    cfg: dqn_config.Config,
    learner: Learner,
    batch: replay_lib.Batch,
    buf: replay_lib.Replay,
    key: Array,
) -> tuple[PyTree, dict]:
  """One training step of the bonus on ``bonus_training_inputs``: (bonus state, its metrics).
  With ``context_augment``, CSD's contexts are those inputs, each augmented with that
  probability (CSD-Aug); else the bonus's own contexts."""
  obs, actions = bonus_training_inputs(cfg, batch, buf, jax.random.fold_in(key, 1))
  x = networks.preprocess(obs)
  contexts = None
  if cfg.context_augment > 0:  # CSD-Aug: c_i = x_i, or its augmentation
    aug = functools.partial(augment_lib.paper_augment, include=dqn_config.CONTEXT_AUGMENTATIONS)
    contexts = bonus_inputs(
        cfg,
        augment_lib.apply_with_probability(jax.random.fold_in(key, 2), aug, x, cfg.context_augment),
        actions,
    )
  return bonus_fns(cfg).update(learner.bonus_state, bonus_inputs(cfg, x, actions), contexts)


def update(
    cfg: dqn_config.Config,
    learner: Learner,
    buf: replay_lib.Replay,
    key: Array,
    env_steps: Array | int = 0,
) -> tuple[Learner, replay_lib.Replay, dict]:
  """One learner update: Q-network(s) and bonus together (module docstring). ``env_steps``
  sets the bonus weight β (``beta``) and the importance exponent (``importance_exponent``).
  Returns the replay with the batch's priorities rewritten (``prioritized``; else as given)."""
  batch = sample_batch(cfg, buf, key, env_steps)
  raw, stats = intrinsic_rewards(cfg, learner, batch)
  one_obs = networks.preprocess(batch.obs[:1])
  reward = total_reward(cfg, batch, raw, stats, env_steps)
  int_reward = normalized_bonus(cfg, stats, raw) if cfg.intrinsic_shares_torso else None
  params, opt_state, metrics, per_sample = extrinsic_step(
      cfg, learner._replace(bonus_stats=stats), batch, reward, one_obs, int_reward
  )
  buf = write_priorities(cfg, buf, batch, per_sample)
  n = learner.updates + 1
  target = sync_targets(cfg, n, params, learner.target_params)
  intrinsic = learner.intrinsic
  if cfg.state_action and not cfg.intrinsic_shares_torso:
    int_params, int_opt_state, int_metrics = intrinsic_step(
        cfg, learner, batch, raw, stats, one_obs
    )
    int_target = sync_targets(cfg, n, int_params, intrinsic.target_params)
    intrinsic = IntrinsicHead(int_params, int_target, int_opt_state, intrinsic.bonus_target)
    metrics.update(int_metrics)
  bonus_state, bonus_metrics = bonus_step(cfg, learner, batch, buf, key)
  if cfg.state_action and cfg.steady_prior:
    bonus_target = sync_targets(cfg, n, bonus_state, intrinsic.bonus_target)
    intrinsic = intrinsic._replace(bonus_target=bonus_target)
  metrics = dict(
      metrics,
      **{f"bonus_{k}": v for k, v in bonus_metrics.items()},
      bonus_raw=jnp.sum(raw * batch.step_mask) / jnp.maximum(jnp.sum(batch.step_mask), 1),
      bonus_scale=bonus_lib.scale(stats),
  )
  return (
      Learner(params, target, learner.prior_params, opt_state, bonus_state, stats, n, intrinsic),
      buf,
      metrics,
  )


def metric_names(cfg: dqn_config.Config) -> tuple[str, ...]:
  names = ["q_loss", "q_mean", "target_mean", "grad_norm", "bonus_raw", "bonus_scale"]
  if cfg.bonus_kind != "none":
    names.append("bonus_loss")
  if cfg.state_action:
    names += ["int_loss", "int_q_mean", "int_target_mean"]
  return tuple(names)


def _zero_metrics(cfg: dqn_config.Config) -> dict:
  return {k: jnp.zeros((), jnp.float32) for k in metric_names(cfg)}


def observe(
    cfg: dqn_config.Config,
    state: AgentState,
    obs: Array,
    actions: Array,
    next_obs: Array,
    reward: Array,
    done: Array,
    terminated: Array,
    valid: Array,
) -> tuple[AgentState, Array]:
  """After one vectorised env step (obs --actions--> next_obs, reward, done, ...; all (E, ...)):
  writes the row to replay, resamples the head of envs whose episode ended, and picks the next
  actions (with the current params). Returns (state, next actions (E,))."""
  key, k_mask, k_heads, k_act = jax.random.split(state.key, 4)
  learner = state.learner
  if cfg.bonus_kind != "none" and not cfg.bonus_at_update:
    r_int = bonus_fns(cfg).score(learner.bonus_state, networks.preprocess(next_obs))
  else:
    r_int = jnp.zeros(reward.shape, jnp.float32)
  mask = jax.random.bernoulli(k_mask, cfg.mask_prob, (cfg.num_envs, cfg.num_heads))
  features = bonus_features(cfg, networks.preprocess(obs)) if cfg.stores_bonus_features else None
  buf = replay_lib.add(
      state.replay,
      obs,
      actions,
      reward,
      r_int,
      done,
      terminated,
      valid,
      mask,
      n_step=cfg.n_step,
      features=features,
  )
  env_steps = state.env_steps + cfg.num_envs
  heads = jnp.where(done, jax.random.randint(k_heads, done.shape, 0, cfg.num_heads), state.heads)
  next_actions = act(cfg, learner, heads, next_obs, env_steps, k_act)
  return AgentState(learner, buf, heads, env_steps, key), next_actions


def ready_to_learn(cfg: dqn_config.Config, state: AgentState) -> Array:
  """True (a device bool) once ``learning_starts`` env steps are in and replay can be sampled,
  on every ``update_period``-th vectorised step (``env_steps`` grows by ``num_envs`` a step)."""
  on_period = (state.env_steps // cfg.num_envs) % cfg.update_period == 0
  return (
      (state.env_steps >= cfg.learning_starts)
      & on_period
      & (replay_lib.num_sampleable(state.replay, cfg.n_step) > 0)
  )


def learn(
    cfg: dqn_config.Config, state: AgentState, ready: bool | None = None
) -> tuple[AgentState, dict]:
  """``updates_per_step`` calls of ``update`` when ``ready_to_learn`` (else nothing). Metrics
  are averaged over the updates; ``updated`` says whether any ran.

  ``ready``: None decides on device (``lax.cond``: for the scanned DeepSea loop); a Python bool
  (static under jit) is the host's decision. The host-driven VizDoom loop passes it: XLA:CPU runs
  convolution backward passes inside ``lax.cond`` / loops several times slower (docs/results.md
  has the measurement).
  """
  key, k_update = jax.random.split(state.key)

  def run(learner_buf):  # a static, unrolled loop: no while-loop around the conv backward passes
    learner, buf = learner_buf
    acc = _zero_metrics(cfg)
    for i in range(cfg.updates_per_step):
      learner, buf, m = update(cfg, learner, buf, jax.random.fold_in(k_update, i), state.env_steps)
      acc = {k: acc[k] + m[k] / cfg.updates_per_step for k in acc}
    return (learner, buf), acc

  skip = lambda learner_buf: (learner_buf, _zero_metrics(cfg))
  if ready is None:
    ready = ready_to_learn(cfg, state)
    (learner, buf), metrics = jax.lax.cond(ready, run, skip, (state.learner, state.replay))
  else:
    (learner, buf), metrics = (run if ready else skip)((state.learner, state.replay))
  metrics["updated"] = jnp.asarray(ready, jnp.float32)
  return state._replace(learner=learner, replay=buf, key=key), metrics


def step(
    cfg: dqn_config.Config,
    state: AgentState,
    obs: Array,
    actions: Array,
    next_obs: Array,
    reward: Array,
    done: Array,
    terminated: Array,
    valid: Array,
) -> tuple[AgentState, Array, dict]:
  """``observe`` then ``learn``: everything the agent does after one vectorised env step.
  Returns (state, next actions (E,), update metrics)."""
  state, next_actions = observe(cfg, state, obs, actions, next_obs, reward, done, terminated, valid)
  state, metrics = learn(cfg, state)
  return state, next_actions, metrics


def first_actions(
    cfg: dqn_config.Config, state: AgentState, obs: Array
) -> tuple[AgentState, Array]:
  """Actions for the first observation of a run (or of a resumed run)."""
  key, k_act = jax.random.split(state.key)
  return state._replace(key=key), act(cfg, state.learner, state.heads, obs, state.env_steps, k_act)


# ------------------------------------------------------------------------------------------
# Fully jitted collect + update for a JAX env (DeepSea).


class EnvLoop(NamedTuple):
  """Carry of the scanned loop: agent, JAX env state, current obs and the actions to take."""

  agent: AgentState
  env_state: PyTree
  obs: Array
  actions: Array


def chunk_body(cfg: dqn_config.Config, env_step: Callable) -> Callable:
  """The scanned step of ``make_chunk``: ``body(loop, _) -> (loop, record)``, one vectorised
  env step followed by ``step``. Records: reward, done, success, valid (E,) and the update
  metrics (scalars)."""

  def body(loop: EnvLoop, _):
    env_state, out = env_step(loop.env_state, loop.actions)
    agent, actions, metrics = step(
        cfg,
        loop.agent,
        loop.obs,
        loop.actions,
        out.obs,
        out.reward,
        out.done,
        out.info["terminated"],
        out.valid,
    )
    obs = out.obs.astype(loop.obs.dtype)
    record = dict(reward=out.reward, done=out.done, success=out.success, valid=out.valid, **metrics)
    return EnvLoop(agent, env_state, obs, actions), record

  return body


@functools.lru_cache(maxsize=16)
def make_chunk(cfg: dqn_config.Config, env_step: Callable, num_steps: int) -> Callable:
  """A jitted ``chunk(loop) -> (loop, per-step outputs)`` running ``num_steps`` vectorised env
  steps, each followed by ``step`` (learning included), under one ``lax.scan``.

  ``env_step(env_state, actions) -> (env_state, rl.vec_env.Step)`` must be jit-able (DeepSea's
  ``rl.deepsea_env.deep_sea_fns``). Per-step outputs: reward, done, success, valid
  (num_steps, E) and the update metrics (num_steps,). Cached: the same (cfg, env_step, num_steps) gives the same
  compiled function (the exploration grid reuses it across seeds).
  """
  body = chunk_body(cfg, env_step)

  @functools.partial(jax.jit, donate_argnums=0)
  def chunk(loop: EnvLoop):
    return jax.lax.scan(body, loop, None, length=num_steps)

  return chunk


@functools.lru_cache(maxsize=16)
def make_seeds_chunk(cfg: dqn_config.Config, env_step: Callable, num_steps: int) -> Callable:
  """``make_chunk`` for S independent runs (seeds) as one program: a jitted
  ``chunk(loops, active) -> (loops, per-step outputs)``, ``jax.vmap`` of the scanned chunk over
  the leading seed axis of every leaf of ``loops`` (an ``EnvLoop`` of S stacked runs). Outputs
  have the seed axis first: (S, num_steps, E) and (S, num_steps).

  ``active`` (S,) bool: a run whose entry is False keeps its state (it was stopped by its own
  stop rule and must stay where it stopped); its outputs are computed and to be ignored.
  Sharding the seed axis of ``loops`` over devices (``jax.sharding.NamedSharding``) shards the
  whole program: nothing couples the seeds, so jit partitions it without communication.

  Under vmap the learner's ``lax.cond`` (``learn``) becomes a select: every seed computes its
  update before ``learning_starts`` too and discards it. The result per seed agrees with
  ``make_chunk``'s up to float rounding, not bitwise: XLA:CPU compiles the batched program
  differently (docs/results.md, "DeepSea seeds as one program", says where).
  """
  body = chunk_body(cfg, env_step)
  one = lambda loop: jax.lax.scan(body, loop, None, length=num_steps)

  @functools.partial(jax.jit, donate_argnums=0)
  def chunk(loops: EnvLoop, active: Array):
    new, records = jax.vmap(one)(loops)
    keep = lambda n, o: jnp.where(active.reshape(active.shape + (1,) * (n.ndim - 1)), n, o)
    return jax.tree.map(keep, new, loops), records

  return chunk
