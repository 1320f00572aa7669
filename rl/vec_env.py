"""The interface of the DQN loop's environments (``rl.doom_env``, ``rl.deepsea_env``).

Both are vectorised over ``num_envs``::

    obs, info = env.reset()
    step = env.step(actions)   # Step(obs, reward, done, success, valid, info), numpy arrays

* ``reward``: the *extrinsic* reward, float32 (num_envs,). MyWayHome: 1.0 on success, else 0
  (Pathak et al. 2017). DeepSea: bsuite's reward (1 at the treasure, -0.01/N per right move).
* ``done``: bool (num_envs,), the episode ended at this step (terminated or truncated);
  ``info["terminated"]`` / ``info["truncated"]`` tell which (bootstrap through truncation).
* ``success``: bool (num_envs,), reached the goal (armor / treasure) at this step.
* ``valid``: bool (num_envs,), False on the step that follows a ``done``. Both environments
  auto-reset *on the next call* after ``done`` (envpool's semantics; DeepSea is made to match):
  that call ignores its action and returns the new episode's first obs with reward 0, so the
  pair (terminal obs -> first obs) is not a transition of the MDP. Replay and intrinsic-reward
  training data must drop rows with ``valid == False``.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class Step(NamedTuple):
  """One vectorised step; every field has leading dim num_envs.

  obs: (num_envs, *obs_shape) (uint8 for Doom, float32 for DeepSea); reward float32;
  done, success, valid bool; info: dict of arrays (always has "terminated", "truncated").
  """

  obs: np.ndarray
  reward: np.ndarray
  done: np.ndarray
  success: np.ndarray
  valid: np.ndarray
  info: dict


def check_actions(env_id: str, actions, num_envs: int, num_actions: int) -> np.ndarray:
  """``actions`` as an int array of shape (num_envs,) in [0, num_actions), else ValueError."""
  a = np.asarray(actions)
  if a.shape != (num_envs,) or not np.issubdtype(a.dtype, np.integer):
    raise ValueError(
        f"{env_id}: actions must be integers of shape ({num_envs},), " f"got {a.dtype} {a.shape}"
    )
  if a.min() < 0 or a.max() >= num_actions:
    raise ValueError(
        f"{env_id}: actions must be in [0, {num_actions}), " f"got range [{a.min()}, {a.max()}]"
    )
  return a
