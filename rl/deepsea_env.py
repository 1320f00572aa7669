"""DeepSea (bsuite's deep-exploration chain) in JAX, vectorised, with the ``rl.vec_env``
interface: gymnax's DeepSea-bsuite dynamics, envpool-style auto-reset.

``deep_sea_fns`` gives the pure, jitted (reset, step) that ``rl.dqn.make_chunk`` scans beside
the learner; ``DeepSeaVecEnv`` wraps them with numpy in and out, as ``rl.doom_env.DoomVecEnv``.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from rl import vec_env


class DeepSeaState(NamedTuple):
  """Batched DeepSea state: gymnax env states (leading dim num_envs), reset flags, PRNG key."""

  env_state: Any
  needs_reset: Any  # bool (num_envs,): the previous step ended the episode
  key: Any


def deep_sea_fns(
    size: int, num_envs: int, mapping_seed: int = 0, deterministic: bool = True
) -> tuple[Callable, Callable]:
  """Pure, jitted (reset, step) for ``num_envs`` copies of one DeepSea(size) MDP.

  The action that moves right is drawn per cell (row, column) from ``mapping_seed``, as bsuite
  does (gymnax's ``randomize_actions``), shared by all envs, fixed across episodes.
  ``reset(key) -> (state, obs)``; ``step(state, actions) -> (state, vec_env.Step)`` with jax arrays:
  obs float32 (num_envs, size*size), the flattened one-hot (row, column) grid (all zeros once
  the agent has left the last row); reward float32: 1 at the treasure (bottom-right cell,
  reached by moving right N times), -0.01/N per right move; ``done`` after exactly ``size``
  steps (terminated, never truncated); success = treasure reward collected; envpool-style
  auto-reset on the next call with ``valid = False``.
  """
  from gymnax.environments.bsuite.deep_sea import DeepSea  # DeepSea only; VizDoom runs without it

  if int(size) < 1 or int(num_envs) < 1:
    raise ValueError(f"size and num_envs must be >= 1, got size={size}, num_envs={num_envs}")
  env = DeepSea(size=int(size), action_mapping_key=jax.random.key(int(mapping_seed)))
  params = env.default_params.replace(deterministic=bool(deterministic))

  def reset_one(key):
    obs, s = env.reset_env(key, params)
    return s, obs.reshape(-1)

  def step_one(key, s, needs_reset, action):
    k_reset, k_step = jax.random.split(key)
    s_reset, obs_reset = reset_one(k_reset)
    obs_step, s_step, reward, terminated, _ = env.step_env(k_step, s, action, params)
    truncated = (s_step.time >= params.max_steps_in_episode) & ~terminated
    success = s_step.denoised_return > s.denoised_return
    s_new = jax.tree.map(lambda r, t: jnp.where(needs_reset, r, t), s_reset, s_step)
    obs = jnp.where(needs_reset, obs_reset, obs_step.reshape(-1))
    live = ~needs_reset
    return (
        s_new,
        obs,
        jnp.where(live, reward, 0.0).astype(jnp.float32),
        live & (terminated | truncated),
        live & success,
        live & terminated,
        live & truncated,
    )

  @jax.jit
  def reset(key):
    k_envs, k_next = jax.random.split(key)
    s, obs = jax.vmap(reset_one)(jax.random.split(k_envs, num_envs))
    return DeepSeaState(s, jnp.zeros(num_envs, bool), k_next), obs

  @jax.jit
  def step(state: DeepSeaState, actions):
    k_envs, k_next = jax.random.split(state.key)
    s, obs, reward, done, success, term, trunc = jax.vmap(step_one)(
        jax.random.split(k_envs, num_envs),
        state.env_state,
        state.needs_reset,
        jnp.asarray(actions, jnp.int32),
    )
    valid = ~state.needs_reset
    info = {"terminated": term, "truncated": trunc, "row": s.row, "column": s.column}
    return DeepSeaState(s, done, k_next), vec_env.Step(obs, reward, done, success, valid, info)

  return reset, step


class DeepSeaVecEnv:
  """Stateful numpy wrapper of ``deep_sea_fns`` with the interface of ``rl.vec_env``, as
  ``rl.doom_env.DoomVecEnv``.

  ``action_mapping``: int (size, size), the action that moves right in each cell.
  """

  def __init__(
      self, size: int, num_envs: int, seed: int, mapping_seed: int = 0, deterministic: bool = True
  ):
    self.size, self.num_envs, self.num_actions = int(size), int(num_envs), 2
    self.obs_shape = (self.size * self.size,)
    self.env_id = f"DeepSea-{self.size} (gymnax DeepSea-bsuite, {self.num_envs} envs)"
    self._reset, self._step = deep_sea_fns(size, num_envs, mapping_seed, deterministic)
    self._key = jax.random.key(int(seed))
    self._state = None

  @property
  def action_mapping(self) -> np.ndarray:
    if self._state is None:
      raise RuntimeError(f"{self.env_id}: call reset() first")
    return np.asarray(self._state.env_state.action_mapping[0])

  def reset(self) -> tuple[np.ndarray, dict]:
    """Resets all envs. Returns obs float32 (num_envs, size*size) and info (row, column)."""
    self._key, k = jax.random.split(self._key)
    self._state, obs = self._reset(k)
    s = self._state.env_state
    return np.asarray(obs), {"row": np.asarray(s.row), "column": np.asarray(s.column)}

  def step(self, actions) -> vec_env.Step:
    """Steps all envs. ``actions``: ints in {0, 1}, shape (num_envs,)."""
    if self._state is None:
      raise RuntimeError(f"{self.env_id}: call reset() before step()")
    a = vec_env.check_actions(self.env_id, actions, self.num_envs, self.num_actions)
    self._state, out = self._step(self._state, a)
    return vec_env.Step(
        *(np.asarray(x) for x in out[:5]), {k: np.asarray(v) for k, v in out.info.items()}
    )
