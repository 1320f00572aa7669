r"""Train one DQN-family agent on DeepSea, collecting and learning on device; resumable.

    python -m rl.deepsea --config=configs/deepsea.py:csd --config.size=20 \
        --config.total_steps=70000 --out_dir=/tmp/ds20_csd

Agents (``rl.dqn``): ``dqn`` (ε-greedy double DQN), ``csd`` / ``rnd`` (DQN + intrinsic bonus,
``rl.bonus``), ``bdqn`` (bootstrapped DQN with randomised prior functions); the config
(``configs/deepsea.py``) holds every setting. The whole loop runs jitted: ``config.chunk_steps``
vectorised env steps of the JAX DeepSea (``rl.envs.deep_sea_fns``), each followed by the
learner's ``rl.dqn.step``, under one ``lax.scan`` (``rl.dqn.make_chunk``).

Writes into ``--out_dir``: ``summary.json`` (``solved``: goal reached at least once,
``first_success_step``, ``first_success_episode``, ``max_right_moves`` (the most right moves in
one episode: how close the agent came; N is the treasure), ``success_rate_last_100``, ``sps`` (agent env
steps/s, learning included), ``env_sps`` (raw env steps/s, random actions), ``episodes``, the
full ``config``, ...), ``episodes.json``, ``learning_curve.png``, ``tb/`` (TensorBoard scalars),
``checkpoints/`` (orbax: the agent state, i.e. params, optimizer state, replay buffer, counters and RNG, the env
state and the episode records), ``deepsea.flags`` and ``deepsea.config.json``. Rerunning with
the same config resumes from the latest checkpoint; a larger ``total_steps`` continues training.
"""

from __future__ import annotations

import functools
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags

from csd_jax import models
from csd_jax import parallel
from rl import bookkeeping
from rl import dqn
from rl import envs
from rl import networks
from uncertainty_kit import cli

FLAGS = flags.FLAGS

# The sub-configs of each agent's profile (configs/deepsea.py).
PARTS = {"dqn": (), "csd": ("bonus", "csd"), "rnd": ("bonus", "rnd"), "bdqn": ("bdqn",),
         "csd_sa": ("bonus", "csd"), "rnd_sa": ("bonus", "rnd")}


@functools.lru_cache(maxsize=16)
def deep_sea(size: int, num_envs: int, mapping_seed: int):
  """Cached (reset, step) of ``rl.envs.deep_sea_fns``: one closure per MDP, so compiled
  training chunks are reused across seeds."""
  return envs.deep_sea_fns(size, num_envs, mapping_seed=mapping_seed)


def env_steps_per_second(size: int, num_envs: int, mapping_seed: int, num_steps: int = 2000
                         ) -> float:
  """Raw DeepSea env steps/s (random actions, jitted scan), compile excluded."""
  reset, step = deep_sea(size, num_envs, mapping_seed)

  @jax.jit
  def run(key):
    state, _ = reset(key)

    def body(carry, k):
      state, acc = carry
      state, out = step(state, jax.random.randint(k, (num_envs,), 0, 2))
      return (state, acc + out.reward.sum()), None

    return jax.lax.scan(body, (state, 0.0), jax.random.split(key, num_steps))[0][1]

  run(jax.random.PRNGKey(0)).block_until_ready()
  t = time.perf_counter()
  run(jax.random.PRNGKey(1)).block_until_ready()
  return num_steps * num_envs / (time.perf_counter() - t)


def right_moves(returns, successes, size: int) -> np.ndarray:
  """Right moves per episode of DeepSea-``size``, read from its return (bsuite's reward: -0.01/N
  per right move, +1 at the treasure, which takes N of them): (E,) ints."""
  # the move cost the env charges: rl.envs.deep_sea_fns keeps gymnax's default
  from gymnax.environments.bsuite.deep_sea import EnvParams
  returns, successes = np.asarray(returns, np.float64), np.asarray(successes, np.float64)
  return np.rint((successes - returns) * size / EnvParams().unscaled_move_cost).astype(int)


def learner_config(config: cli.ConfigDict, mesh=None, gather_one_hot: bool = True
                   ) -> dqn.Config:
  """The learner of ``config``: MLPs on the one-hot (size², ) observation, 2 actions.

  ``gather_one_hot``: the nets' first layers gather the kernel rows of the hot grid cell (and
  action) instead of multiplying the one-hot inputs (``models.MLPSpec.one_hot_blocks``): the
  same function, at a cost that no longer grows with size². False: the dense product."""
  widths = tuple(config.dqn.q_widths)
  obs_blocks = (config.size ** 2,) if gather_one_hot else ()
  pair_blocks = (*obs_blocks, 2) if gather_one_hot else ()
  bonus_blocks = pair_blocks if config.agent in ("csd_sa", "rnd_sa") else obs_blocks
  bonus_spec = towers = None
  if config.agent in ("csd", "csd_sa"):
    bonus_spec = models.MLPSpec(widths=(int(config.csd.prior_width),), out_dim=1,
                                one_hot_blocks=bonus_blocks)
  elif config.agent in ("rnd", "rnd_sa"):
    bonus_spec = networks.mlp_spec(widths, 1, one_hot_blocks=bonus_blocks)
  if config.agent == "csd_sa":
    towers = networks.mlp_spec(tuple(config.csd.tower_widths), 1, one_hot_blocks=pair_blocks)
  return dqn.make_config(config, obs_shape=(config.size ** 2,), num_actions=2,
                         q_spec=networks.mlp_spec(widths, 2, one_hot_blocks=obs_blocks),
                         bonus_spec=bonus_spec, shared_torso=False, mesh=mesh,
                         csd_towers=towers)


def check(config: cli.ConfigDict) -> None:
  """Raises ``cli.ConfigError`` naming the first bad field."""
  bookkeeping.check(config, PARTS)
  cli.check(config, positive=["size", "chunk_steps"], non_negative=["mapping_seed"])


def initial_loop(config: cli.ConfigDict, cfg: dqn.Config):
  """Step 0 of ``config``'s run: (``dqn.EnvLoop`` with the envs reset and the agent initialised
  from ``config.seed``, the envs' jittable step function)."""
  k_env, k_agent = jax.random.split(jax.random.PRNGKey(config.seed))
  reset, env_step = deep_sea(config.size, cfg.num_envs, config.mapping_seed)
  env_state, obs = reset(k_env)
  obs = obs.astype(jnp.float32)
  agent, actions = dqn.first_actions(cfg, dqn.init(cfg, k_agent, obs), obs)
  return dqn.EnvLoop(agent, env_state, obs, actions), env_step


def train(config: cli.ConfigDict, out_dir: str, *, checkpoint_dir: str | None = None,
          tensorboard: bool = True, mesh: str = "", verbose: bool = True) -> dict:
  """Runs (or resumes) one training run; returns the summary (also in OUT_DIR/summary.json).

  ``config``: a ``configs/deepsea.py`` config. ``mesh`` ("data=8"): data-parallel learner
  updates over the devices of that mesh (the result does not depend on it).
  """
  check(config)
  cfg = learner_config(config, parallel.make_mesh(mesh) if mesh else None)
  run = bookkeeping.Run(config, out_dir, num_envs=cfg.num_envs, checkpoint_dir=checkpoint_dir,
                        tensorboard=tensorboard, verbose=verbose,
                        epsilon=lambda step: float(dqn.epsilon(cfg, jnp.asarray(step))),
                        label=f"{config.agent} deepsea-{config.size} seed {config.seed}")

  # Environment and agent.
  loop, env_step = initial_loop(config, cfg)
  env_sps = env_steps_per_second(config.size, cfg.num_envs, config.mapping_seed)
  tree = dict(loop=loop)
  tree = run.restore(tree) or tree
  if cfg.mesh is not None:  # params, replay and env state on every device of the mesh
    tree = parallel.replicate(cfg.mesh, tree)

  # Train: chunks of collect-and-learn steps until a stop rule holds.
  chunk = dqn.make_chunk(cfg, env_step, config.chunk_steps)
  now = int(tree["loop"].agent.env_steps)
  run.start(now)
  while not run.should_stop(now):
    before = now
    loop, rec = chunk(tree["loop"])
    tree = dict(loop=loop)
    rec = jax.device_get(rec)       # per step: reward, done, success, valid (T, E), metrics (T,)
    now = int(loop.agent.env_steps)
    run.episodes.add_rows(before, rec["reward"], rec["done"], rec["success"], rec["valid"])
    updated = rec["updated"] > 0
    if updated.any():
      run.add_metrics({k: np.mean(rec[k][updated]) for k in dqn.metric_names(cfg)})
    run.after_steps(before, now, tree, env_sps=env_sps)

  moves = right_moves(run.episodes.ret, run.episodes.success, config.size)
  return run.finish(tree, now, env_sps=env_sps,
                    title=f"{config.agent} on DeepSea-{config.size}, seed {config.seed}",
                    env="deepsea", agent=config.agent, seed=config.seed, size=config.size,
                    max_right_moves=int(moves.max()) if moves.size else None)


def define_flags() -> None:
  """``--config`` (configs/deepsea.py) and where the run writes; called under ``__main__``
  only, never at import (tests/test_binaries.py says why)."""
  cli.define_config("deepsea")
  bookkeeping.define_flags("/tmp/csd_rl")


def main(argv):
  del argv
  bookkeeping.setup()
  config = FLAGS.config
  check(config)
  cli.record(FLAGS.out_dir, "deepsea", config)
  summary = train(config, FLAGS.out_dir, checkpoint_dir=FLAGS.checkpoint_dir,
                  tensorboard=FLAGS.tensorboard, mesh=FLAGS.mesh)
  print(bookkeeping.headline(summary))


if __name__ == "__main__":
  define_flags()
  cli.run(main)
