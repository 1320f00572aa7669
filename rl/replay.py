"""A jitted, on-device ring buffer of vectorised env steps with n-step sampling.

Layout: time-major rows, one row per vectorised env step, ``(T, E, ...)`` for T rows and E envs.
Row ``t`` holds, for each env, what the agent saw and did at step t and what came back::

    obs_t, action_t, reward_t (extrinsic), bonus_t (intrinsic of obs_{t+1}, if computed at
    collection), done_t, terminated_t, valid_t, mask_t (bootstrap mask, (K,)), and optionally
    features_t (what a bonus reads of obs_t, e.g. pooled frames, (D,))

The next observation obs_{t+1} is the ``obs`` of row t+1 (the same env column), so pixels are
stored once. ``valid_t`` is the env's mask: False on the auto-reset step that follows a
``done`` (``rl.vec_env``); that row's obs is the *terminal* observation of the previous episode and
its transition (terminal obs -> first obs) is not one of the MDP. Such rows are never sampled as
transitions, and an n-step return never runs past a ``done``.

n-step target pieces for a sampled row t (``sample``): with k* the first k < n with done_{t+k}
(or none), the return sums rewards t .. t+min(n-1, k*), and bootstraps from
obs_{t+m}, m = min(n, k*+1), with discount γ^m, zeroed if the episode *terminated* (a truncation
bootstraps from the terminal obs, which sits in row t+k*+1).

Prioritised replay (Schaul et al. 2016; ``init(..., prioritized=True)``): a sum tree
(``flashbax.buffers.sum_tree``) over the T * E transitions, leaf ``t * E + e``, holds each one's
priority. A leaf is 0 until its transition can be sampled (its n successors are stored), then the
largest priority recorded so far (0 for an invalid row); it returns to 0 when its row is
overwritten. ``update_priorities`` writes the learner's per-sample losses back. ``sample`` then
draws by stratified proportional sampling and weighs each transition by its importance weight.

Everything is a pure function of a ``Replay`` pytree; capacity and shapes are static.
"""

from __future__ import annotations

from typing import NamedTuple

from flashbax.buffers import sum_tree
import jax
import jax.numpy as jnp

Array = jax.Array

# Candidates drawn per sampled transition; the first valid one is taken. With a fraction q of
# invalid rows a sample is left without a valid candidate with probability q**4 (DeepSea-10:
# q = 1/11 -> 7e-5); such a sample gets weight 0, so an invalid transition never enters a loss.
_CANDIDATES = 4


class Replay(NamedTuple):
  """Ring-buffer contents; ``count`` rows have been written in total (row t at t % T)."""

  obs: Array  # (T, E, *obs_shape), storage dtype (uint8)
  action: Array  # (T, E) int32
  reward: Array  # (T, E) float32, extrinsic
  bonus: Array  # (T, E) float32, intrinsic reward of obs_{t+1} computed at collection
  done: Array  # (T, E) bool
  terminated: Array  # (T, E) bool
  valid: Array  # (T, E) bool
  mask: Array  # (T, E, K) bool, bootstrap masks (all True for K = 1 agents)
  count: Array  # () int32
  priority: sum_tree.SumTreeState | None = None  # prioritised replay: leaf t * E + e
  # (T, E, D) float32: what a bonus reads of obs_t (pooled frames), stored at collection so an
  # update's n-step windows gather D floats per step instead of a frame stack to pool again
  features: Array | None = None


class Batch(NamedTuple):
  """A sampled batch of n-step transitions (B = batch size, n = n_step)."""

  obs: Array  # (B, *obs_shape) obs_t
  action: Array  # (B,) int32
  reward: Array  # (B, n) extrinsic rewards r_t .. r_{t+n-1}
  bonus: Array  # (B, n) stored intrinsic rewards (collection-time mode)
  step_mask: Array  # (B, n) float32: 1 for the steps the n-step return includes
  boot_obs: Array  # (B, *obs_shape) obs_{t+m}
  boot_discount: Array  # (B,) γ^m, 0 if the episode terminated within the window
  next_obs: Array  # (B, *obs_shape) obs_{t+1} (training data of the bonus)
  next_obs_seq: Array | None  # (B, n, *obs_shape) obs_{t+1} .. obs_{t+n}, if requested
  action_seq: Array | None  # (B, n) a_t .. a_{t+n-1}, with next_obs_seq or feature_seq
  mask: Array  # (B, K) bootstrap masks
  weight: Array  # (B,) 1 for a valid transition, 0 if none was found; prioritised: the
  # importance weight (max 1 over the batch), 0 for a zero-priority leaf
  index: Array  # (B,) int32 leaf t * E + e of each transition (``update_priorities``)
  feature_seq: Array | None = None  # (B, n, D) features of obs_t .. obs_{t+n-1}, if requested


def init(
    capacity: int,
    num_envs: int,
    obs_shape: tuple[int, ...],
    obs_dtype,
    num_heads: int = 1,
    prioritized: bool = False,
    feature_dim: int = 0,
) -> Replay:
  """An empty buffer of ``capacity`` rows (capacity * num_envs transitions); ``prioritized``
  adds the sum tree of prioritised replay (module docstring), ``feature_dim`` > 0 a float32
  vector of that size per transition (``Replay.features``)."""
  t, e = int(capacity), int(num_envs)
  if t < 2 or e < 1:
    raise ValueError(f"need capacity >= 2 rows and num_envs >= 1, got {t}, {e}")
  z = lambda dtype: jnp.zeros((t, e), dtype)
  return Replay(
      obs=jnp.zeros((t, e, *obs_shape), obs_dtype),
      action=z(jnp.int32),
      reward=z(jnp.float32),
      bonus=z(jnp.float32),
      done=z(bool),
      terminated=z(bool),
      valid=z(bool),
      mask=jnp.zeros((t, e, num_heads), bool),
      count=jnp.zeros((), jnp.int32),
      priority=sum_tree.init(t * e) if prioritized else None,
      features=jnp.zeros((t, e, int(feature_dim)), jnp.float32) if feature_dim > 0 else None,
  )


def capacity(buf: Replay) -> int:
  return buf.obs.shape[0]


def add(
    buf: Replay,
    obs: Array,
    action: Array,
    reward: Array,
    bonus: Array,
    done: Array,
    terminated: Array,
    valid: Array,
    mask: Array,
    n_step: int | None = None,
    features: Array | None = None,
) -> Replay:
  """Writes one row (every argument has leading dim E; ``mask`` is (E, K); ``features``
  (E, D), given exactly when the buffer stores them). A prioritised buffer needs the learner's
  ``n_step``: the row n_step rows back becomes sampleable."""
  if (features is None) != (buf.features is None):
    raise ValueError(
        "features must be given exactly when the buffer stores them (init(feature_dim=D)), "
        f"got {'none' if features is None else features.shape} for a buffer "
        f"{'without' if buf.features is None else 'with'} them"
    )
  i = buf.count % capacity(buf)
  priority = buf.priority
  if priority is not None:
    if n_step is None or not 1 <= n_step < capacity(buf):
      raise ValueError(f"a prioritised buffer needs n_step in [1, capacity), got {n_step}")
    # row i is overwritten (its leaves leave the tree); row count - n_step now has its n
    # successors and enters at the largest priority so far (Schaul et al. 2016, Alg. 1)
    ready = (buf.count - n_step) % capacity(buf)
    enters = jnp.where(buf.count >= n_step, priority.max_recorded_priority, 0.0)
    leaves = jnp.concatenate([_row_leaves(buf, i), _row_leaves(buf, ready)])
    values = jnp.concatenate([jnp.zeros(buf.obs.shape[1]), enters * buf.valid[ready]])
    priority = sum_tree.set_batch_bincount(priority, leaves, values)
  put = lambda a, v: jax.lax.dynamic_update_index_in_dim(a, v.astype(a.dtype), i, 0)
  return Replay(
      obs=put(buf.obs, obs),
      action=put(buf.action, action),
      reward=put(buf.reward, reward),
      bonus=put(buf.bonus, bonus),
      done=put(buf.done, done),
      terminated=put(buf.terminated, terminated),
      valid=put(buf.valid, valid),
      mask=put(buf.mask, mask),
      count=buf.count + 1,
      priority=priority,
      features=None if features is None else put(buf.features, features),
  )


def _row_leaves(buf: Replay, row: Array) -> Array:
  """The sum-tree leaves (E,) of one row."""
  num_envs = buf.obs.shape[1]
  return row * num_envs + jnp.arange(num_envs)


def update_priorities(buf: Replay, index: Array, priority: Array) -> Replay:
  """Sets the priorities (B,) of the sampled leaves ``index`` (``Batch.index``); a leaf at 0
  (not sampleable, or invalid) stays at 0. A leaf drawn twice gets one of its two values, which
  agree: both are the loss of the same transition."""
  if buf.priority is None:
    raise ValueError("update_priorities needs a prioritised buffer (init(prioritized=True))")
  old = sum_tree.get_batch(buf.priority, index)
  new = jnp.where(old > 0, priority.astype(old.dtype), 0.0)
  return buf._replace(priority=sum_tree.set_batch_bincount(buf.priority, index, new))


def invalidate_last(buf: Replay) -> Replay:
  """Marks the newest row as invalid and done (its next obs will never arrive: used after
  resuming a run whose env state could not be saved, e.g. envpool)."""
  i = (buf.count - 1) % capacity(buf)
  ok = buf.count > 0
  valid = buf.valid.at[i].set(jnp.where(ok, False, buf.valid[i]))
  done = buf.done.at[i].set(jnp.where(ok, True, buf.done[i]))
  return buf._replace(valid=valid, done=done)


def num_sampleable(buf: Replay, n_step: int) -> Array:
  """Rows t whose rows t .. t+n are all in the buffer (valid or not)."""
  lo = jnp.maximum(0, buf.count - capacity(buf))
  return jnp.maximum(0, buf.count - n_step - lo)


def sample(
    buf: Replay,
    key: Array,
    batch_size: int,
    n_step: int,
    gamma: float,
    with_next_obs_seq: bool = False,
    importance_exponent: Array | float = 1.0,
    with_feature_seq: bool = False,
) -> Batch:
  """Samples ``batch_size`` valid n-step transitions (module docstring): uniformly, or, from a
  prioritised buffer, in proportion to priority with importance weights
  (N P(i))^-``importance_exponent`` divided by the batch's largest. ``with_next_obs_seq`` /
  ``with_feature_seq`` add the window's observations / stored features (and its actions)."""
  cap, num_envs = capacity(buf), buf.obs.shape[1]
  if n_step < 1 or n_step >= cap:
    raise ValueError(f"n_step must be in [1, capacity), got {n_step} (capacity {cap})")
  if with_feature_seq and buf.features is None:
    raise ValueError("with_feature_seq needs a buffer that stores features (init(feature_dim=D))")
  if buf.priority is None:
    t, e, weight = _uniform_rows(buf, key, batch_size, n_step)
  else:
    leaf = sum_tree.stratified_sample(buf.priority, batch_size, key)
    t, e = leaf // num_envs, leaf % num_envs
    p = sum_tree.get_batch(buf.priority, leaf)
    # a zero leaf is drawn only through float rounding in the tree's sums: weight 0
    n_p = num_sampleable(buf, n_step) * num_envs * p / jnp.maximum(buf.priority.nodes[0], 1e-30)
    w = jnp.where(p > 0, jnp.where(p > 0, n_p, 1.0) ** -importance_exponent, 0.0)
    weight = w / jnp.maximum(jnp.max(w), 1e-30)

  steps = t[:, None] + jnp.arange(n_step)[None, :]  # (B, n)
  rows, cols = steps % cap, e[:, None]
  done = buf.done[rows, cols]
  # step k is included iff no done strictly before it
  before = jnp.cumsum(done, axis=1) - done
  step_mask = (before == 0).astype(jnp.float32)
  any_done = jnp.any(done, axis=1)
  k_star = jnp.argmax(done, axis=1)
  m = jnp.where(any_done, k_star + 1, n_step)
  term = jnp.take_along_axis(buf.terminated[rows, cols], k_star[:, None], axis=1)[:, 0]
  boot_discount = jnp.where(any_done & term, 0.0, gamma ** m.astype(jnp.float32))
  boot_obs = buf.obs[(t + m) % cap, e]
  next_obs = buf.obs[(t + 1) % cap, e]
  seq = buf.obs[(steps + 1) % cap, cols] if with_next_obs_seq else None
  action_seq = buf.action[rows, cols] if with_next_obs_seq or with_feature_seq else None
  return Batch(
      obs=buf.obs[t % cap, e],
      action=buf.action[t % cap, e],
      reward=buf.reward[rows, cols],
      bonus=buf.bonus[rows, cols],
      step_mask=step_mask,
      boot_obs=boot_obs,
      boot_discount=boot_discount.astype(jnp.float32),
      next_obs=next_obs,
      next_obs_seq=seq,
      action_seq=action_seq,
      mask=buf.mask[t % cap, e],
      weight=weight.astype(jnp.float32),
      index=((t % cap) * num_envs + e).astype(jnp.int32),
      feature_seq=buf.features[rows, cols] if with_feature_seq else None,
  )


def _uniform_rows(
    buf: Replay, key: Array, batch_size: int, n_step: int
) -> tuple[Array, Array, Array]:
  """Absolute rows t (B,), envs e (B,) and weights (B,) of valid transitions drawn uniformly:
  the first valid of ``_CANDIDATES`` draws, weight 0 if none is."""
  cap, num_envs = capacity(buf), buf.obs.shape[1]
  lo = jnp.maximum(0, buf.count - cap)
  span = jnp.maximum(1, num_sampleable(buf, n_step))
  k_t, k_e = jax.random.split(key)
  shape = (batch_size, _CANDIDATES)
  t = lo + jax.random.randint(k_t, shape, 0, span)  # absolute row index
  e = jax.random.randint(k_e, shape, 0, num_envs)
  ok = buf.valid[t % cap, e] & (num_sampleable(buf, n_step) > 0)
  first = jnp.argmax(ok, axis=1)
  pick = lambda a: jnp.take_along_axis(a, first[:, None], axis=1)[:, 0]
  return pick(t), pick(e), jnp.any(ok, axis=1).astype(jnp.float32)


def sample_recent(
    buf: Replay, key: Array, batch_size: int, window: int
) -> tuple[Array, Array, Array]:
  """Valid transitions drawn uniformly from the newest ``window`` rows (training data for a
  bonus that should forget novelty quickly): (obs_t (B, *obs_shape), a_t (B,),
  obs_{t+1} (B, *obs_shape))."""
  cap, num_envs = capacity(buf), buf.obs.shape[1]
  newest = buf.count - 2  # newest row whose successor is stored
  lo = jnp.maximum(jnp.maximum(0, buf.count - cap), newest - window + 1)
  span = jnp.maximum(1, newest - lo + 1)
  k_t, k_e = jax.random.split(key)
  shape = (batch_size, _CANDIDATES)
  t = lo + jax.random.randint(k_t, shape, 0, span)
  e = jax.random.randint(k_e, shape, 0, num_envs)
  first = jnp.argmax(buf.valid[t % cap, e], axis=1)
  pick = lambda a: jnp.take_along_axis(a, first[:, None], axis=1)[:, 0]
  t, e = pick(t), pick(e)
  return buf.obs[t % cap, e], buf.action[t % cap, e], buf.obs[(t + 1) % cap, e]
