r"""Train one DQN-family agent on DeepSea, collecting and learning on device; resumable.

    python -m rl.deepsea --config=configs/deepsea.py:csd --config.size=20 \
        --config.total_steps=70000 --out_dir=/tmp/ds20_csd

Agents (``rl.dqn``): ``dqn`` (ε-greedy double DQN), ``csd`` / ``rnd`` (DQN + intrinsic bonus,
``rl.bonus``), ``bdqn`` (bootstrapped DQN with randomised prior functions); the config
(``configs/deepsea.py``) holds every setting. The whole loop runs jitted: ``config.chunk_steps``
vectorised env steps of the JAX DeepSea (``rl.deepsea_env.deep_sea_fns``), each followed by
the learner's ``rl.dqn.step``, under one ``lax.scan`` (``rl.dqn.make_chunk``).

Writes into ``--out_dir``: ``summary.json`` (``solved``: goal reached at least once,
``first_success_step``, ``first_success_episode``, ``max_right_moves`` (the most right moves in
one episode: how close the agent came; N is the treasure), ``bsuite_learned_episode`` (bsuite's
solved criterion: the first episode at which under 90 % of the episodes so far missed the
treasure; a run stopped soon after its first success rarely gets there),
``success_rate_last_100``, ``sps`` (agent env steps/s, learning included), ``env_sps`` (raw env
steps/s, random actions), ``episodes``, the full ``config``, ...), ``episodes.json``,
``learning_curve.png``, ``tb/`` (TensorBoard scalars), ``checkpoints/`` (orbax: the agent state,
i.e. params, optimizer state, replay buffer, counters and RNG, the env state and the episode
records), ``deepsea.flags`` and ``deepsea.config.json``. Rerunning with the same config resumes
from the latest checkpoint; a larger ``total_steps`` continues training.

Seeds as one program: ``--config.num_seeds=S`` (``train_seeds``) trains seeds ``seed`` ..
``seed + S - 1`` of one agent and size together, ``jax.vmap`` of the chunk over a leading seed
axis of the whole state (``rl.dqn.make_seeds_chunk``); each seed stops by its own rule, and its
records go to ``OUT_DIR/seed<s>/`` as a one-seed run writes them, with ``seed_group`` (the seeds
run together) added to its summary. One checkpoint folder (``OUT_DIR/checkpoints``) holds the
state with its seed axis; its identity includes the seed list. ``--mesh=data=1,seeds=D`` shards
the seed axis over D devices (``NamedSharding``; jit partitions the program, which couples no
seeds). A seed's results agree with its one-seed run's up to float rounding, not bitwise
(``rl.dqn.make_seeds_chunk``).
"""

from __future__ import annotations

import functools
import time
from pathlib import Path

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags
from jax.sharding import NamedSharding, PartitionSpec as P

from csd_jax import models
from csd_jax import parallel
from rl import agents
from rl import deepsea_env
from rl import dqn
from rl import dqn_config
from rl import networks
from rl import records
from rl import run_config
from rl import startup
from cmdline import cli

FLAGS = flags.FLAGS

# The mesh axis that a seed group's leading (seed) axis is sharded over (``train_seeds``).
SEEDS_AXIS = "seeds"


@functools.lru_cache(maxsize=16)
def deep_sea(size: int, num_envs: int, mapping_seed: int):
  """Cached (reset, step) of ``rl.deepsea_env.deep_sea_fns``: one closure per MDP, so compiled
  training chunks are reused across seeds."""
  return deepsea_env.deep_sea_fns(size, num_envs, mapping_seed=mapping_seed)


def env_steps_per_second(
    size: int, num_envs: int, mapping_seed: int, num_steps: int = 2000
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
  # the move cost the env charges: rl.deepsea_env.deep_sea_fns keeps gymnax's default
  from gymnax.environments.bsuite.deep_sea import EnvParams

  returns, successes = np.asarray(returns, np.float64), np.asarray(successes, np.float64)
  return np.rint((successes - returns) * size / EnvParams().unscaled_move_cost).astype(int)


def episode_fields(episodes, size: int) -> dict:
  """What a DeepSea summary adds to ``rl.records``' fields, read from the episode records:
  ``max_right_moves`` (how close the agent came; N is the treasure) and
  ``bsuite_learned_episode``."""
  moves = right_moves(episodes.ret, episodes.success, size)
  return dict(
      max_right_moves=int(moves.max()) if moves.size else None,
      bsuite_learned_episode=records.bsuite_learned_episode(episodes.success),
  )


def learner_config(
    config: run_config.DeepSea, mesh=None, gather_one_hot: bool = True
) -> dqn_config.Config:
  """The learner of ``config``: MLPs on the one-hot (size², ) observation, 2 actions.

  ``gather_one_hot``: the nets' first layers gather the kernel rows of the hot grid cell (and
  action) instead of multiplying the one-hot inputs (``models.MLPSpec.one_hot_blocks``): the
  same function, at a cost that no longer grows with size². False: the dense product."""
  agent = agents.AGENTS[config.agent]
  widths = config.dqn.q_widths
  obs_blocks = (config.size**2,) if gather_one_hot else ()
  pair_blocks = (*obs_blocks, 2) if gather_one_hot else ()
  bonus_blocks = pair_blocks if agent.state_action else obs_blocks
  bonus_spec = towers = None
  if agent.bonus == "csd":
    bonus_spec = models.MLPSpec(
        widths=(config.csd.prior_width,), out_dim=1, one_hot_blocks=bonus_blocks
    )
  elif agent.bonus == "rnd":
    bonus_spec = networks.mlp_spec(widths, 1, one_hot_blocks=bonus_blocks)
  if agent.deep_csd:
    towers = networks.mlp_spec(config.csd.tower_widths, 1, one_hot_blocks=pair_blocks)
  return run_config.learner(
      config,
      obs_shape=(config.size**2,),
      num_actions=2,
      q_spec=networks.mlp_spec(widths, 2, one_hot_blocks=obs_blocks),
      bonus_spec=bonus_spec,
      shared_torso=False,
      mesh=mesh,
      csd_towers=towers,
  )


def initial_loop(config: run_config.DeepSea, cfg: dqn_config.Config):
  """Step 0 of ``config``'s run: (``dqn.EnvLoop`` with the envs reset and the agent initialised
  from ``config.seed``, the envs' jittable step function)."""
  k_env, k_agent = jax.random.split(jax.random.PRNGKey(config.seed))
  reset, env_step = deep_sea(config.size, cfg.num_envs, config.mapping_seed)
  env_state, obs = reset(k_env)
  obs = obs.astype(jnp.float32)
  agent, actions = dqn.first_actions(cfg, dqn.init(cfg, k_agent, obs), obs)
  return dqn.EnvLoop(agent, env_state, obs, actions), env_step


def train(
    config: run_config.DeepSea,
    out_dir: str,
    *,
    checkpoint_dir: str | None = None,
    tensorboard: bool = True,
    mesh: str = "",
    verbose: bool = True,
) -> dict:
  """Runs (or resumes) one training run; returns the summary (also in OUT_DIR/summary.json).

  ``config``: a checked run (``rl.run_config.from_config``) of one seed (``num_seeds`` 1; more:
  ``train_seeds``). ``mesh`` ("data=8"): data-parallel learner updates over the devices of that
  mesh (the result does not depend on it).
  """
  if config.num_seeds != 1:
    raise cli.ConfigError(
        f"train runs one seed, got --config.num_seeds={config.num_seeds}: "
        "train_seeds runs several"
    )
  cfg = learner_config(config, parallel.make_mesh(mesh) if mesh else None)
  run = records.Run(
      config,
      out_dir,
      num_envs=cfg.num_envs,
      checkpoint_dir=checkpoint_dir,
      tensorboard=tensorboard,
      verbose=verbose,
      epsilon=lambda step: float(dqn.epsilon(cfg, jnp.asarray(step))),
      label=f"{config.agent} deepsea-{config.size} seed {config.seed}",
  )

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
    rec = jax.device_get(rec)  # per step: reward, done, success, valid (T, E), metrics (T,)
    now = int(loop.agent.env_steps)
    run.episodes.add_rows(before, rec["reward"], rec["done"], rec["success"], rec["valid"])
    updated = rec["updated"] > 0
    if updated.any():
      run.add_metrics({k: np.mean(rec[k][updated]) for k in dqn.metric_names(cfg)})
    run.after_steps(before, now, tree, env_sps=env_sps)

  return run.finish(
      tree,
      now,
      env_sps=env_sps,
      title=f"{config.agent} on DeepSea-{config.size}, seed {config.seed}",
      env="deepsea",
      agent=config.agent,
      seed=config.seed,
      size=config.size,
      **episode_fields(run.episodes, config.size),
  )


def seeds_of(config: run_config.DeepSea) -> list[int]:
  """The seeds of ``config``: ``seed`` .. ``seed + num_seeds - 1``."""
  return list(range(config.seed, config.seed + config.num_seeds))


def seed_config(config: run_config.DeepSea, seed: int) -> run_config.DeepSea:
  """The one-seed config of ``seed`` in ``config``'s group: what its one-seed run would get."""
  return dataclasses.replace(config, seed=seed, num_seeds=1)


def initial_loops(config: run_config.DeepSea, cfg: dqn_config.Config, seeds: list[int]):
  """Step 0 of each seed's run (``initial_loop``), stacked on a leading seed axis: (the
  ``dqn.EnvLoop`` of the group, the envs' jittable step function)."""
  loops = [initial_loop(seed_config(config, s), cfg)[0] for s in seeds]
  _, env_step = deep_sea(config.size, cfg.num_envs, config.mapping_seed)
  return jax.tree.map(lambda *xs: jnp.stack(xs), *loops), env_step


def seed_sharding(mesh: str, num_seeds: int) -> NamedSharding | None:
  """The sharding of a group's seed axis over the ``seeds`` axis of ``mesh`` ("data=1,seeds=8",
  ``parallel.make_mesh``'s syntax; "seeds=8" alone is read with data=1); None for ''."""
  if not mesh:
    return None
  axes = dict(part.strip().split("=") for part in mesh.split(","))
  if SEEDS_AXIS not in axes or int(axes.get(parallel.DATA_AXIS, 1)) != 1:
    raise cli.ConfigError(
        f"--mesh={mesh}: seeds trained together shard their seed axis over a "
        f"'{SEEDS_AXIS}' mesh axis, data=1 (e.g. --mesh=data=1,seeds=8); "
        "data-parallel updates are for one seed"
    )
  if parallel.DATA_AXIS not in axes:
    mesh = f"{parallel.DATA_AXIS}=1,{mesh}"
  devices = int(axes[SEEDS_AXIS])
  if num_seeds % devices:
    raise cli.ConfigError(
        f"--mesh={mesh}: {num_seeds} seeds do not divide evenly over " f"{devices} devices"
    )
  return NamedSharding(parallel.make_mesh(mesh), P(SEEDS_AXIS))


def train_seeds(
    config: run_config.DeepSea,
    out_dir: str,
    *,
    seeds: list[int] | None = None,
    seed_dirs: list[str] | None = None,
    checkpoint_dir: str | None = None,
    tensorboard: bool = True,
    mesh: str = "",
    verbose: bool = True,
) -> list[dict]:
  """Runs (or resumes) several seeds of ``config`` as one jitted program (module docstring);
  returns their summaries, each written as ``train`` writes a one-seed run's.

  ``seeds``: default ``seeds_of(config)``. ``seed_dirs``: each seed's output folder (default
  OUT_DIR/seed<s>). ``checkpoint_dir``: the group's checkpoints (default OUT_DIR/checkpoints).
  ``mesh`` ("data=1,seeds=D"): shards the seed axis over D devices (``seed_sharding``).
  """
  seeds = seeds_of(config) if seeds is None else [int(s) for s in seeds]
  if len(set(seeds)) != len(seeds) or not seeds:
    raise cli.ConfigError(f"a seed group needs distinct seeds, got {seeds}")
  sharding = seed_sharding(mesh, len(seeds))
  configs = [seed_config(config, s) for s in seeds]
  cfg = learner_config(configs[0])
  dirs = [Path(d) for d in seed_dirs] if seed_dirs else [Path(out_dir) / f"seed{s}" for s in seeds]
  epsilon = lambda step: float(dqn.epsilon(cfg, jnp.asarray(step)))
  runs = [
      records.Run(
          c,
          d,
          num_envs=cfg.num_envs,
          tensorboard=tensorboard,
          verbose=verbose,
          epsilon=epsilon,
          checkpoints=False,
          label=f"{config.agent} deepsea-{config.size} seed {c.seed}",
      )
      for c, d in zip(configs, dirs)
  ]
  group = records.SeedGroup(
      configs[0], seeds, runs, checkpoint_dir or Path(out_dir) / "checkpoints", verbose=verbose
  )
  try:
    loops, env_step = initial_loops(config, cfg, seeds)
    env_sps = env_steps_per_second(config.size, cfg.num_envs, config.mapping_seed)
    tree = dict(loop=loops)
    if sharding is not None:
      tree = jax.device_put(tree, sharding)
    tree = group.restore(tree) or tree

    chunk = dqn.make_seeds_chunk(cfg, env_step, config.chunk_steps)
    now = [int(n) for n in jax.device_get(tree["loop"].agent.env_steps)]
    group.start(now)
    active = [not run.should_stop(n) for run, n in zip(runs, now)]
    while any(active):
      before = now
      loops, rec = chunk(tree["loop"], jnp.asarray(active))
      tree = dict(loop=loops)
      rec = jax.device_get(rec)  # per seed and step: as train's, with the seed axis first
      now = [int(n) for n in jax.device_get(loops.agent.env_steps)]
      for i, run in enumerate(runs):
        if not active[i]:
          continue
        r = {k: v[i] for k, v in rec.items()}
        run.episodes.add_rows(before[i], r["reward"], r["done"], r["success"], r["valid"])
        updated = r["updated"] > 0
        if updated.any():
          run.add_metrics({k: np.mean(r[k][updated]) for k in dqn.metric_names(cfg)})
        run.after_steps(before[i], now[i], None, env_sps=env_sps)
        if run.should_stop(now[i]):
          run.stop_clock()
          active[i] = False
      group.maybe_save(tree, now)
    group.finish(tree, now)
  except BaseException:
    for run in runs:
      run.close()
    raise

  summaries = []
  for run, c, n in zip(runs, configs, now):
    summaries.append(
        run.finish(
            None,
            n,
            env_sps=env_sps,
            title=f"{config.agent} on DeepSea-{config.size}, seed {c.seed}",
            env="deepsea",
            agent=config.agent,
            seed=c.seed,
            size=config.size,
            **episode_fields(run.episodes, config.size),
            seed_group=seeds,
        )
    )
  return summaries


def define_flags() -> None:
  """``--config`` (configs/deepsea.py) and where the run writes; called under ``__main__``
  only, never at import (tests/test_binaries.py says why)."""
  cli.define_config("deepsea")
  startup.define_flags("/tmp/csd_rl")


def main(argv):
  del argv
  startup.setup()
  config = run_config.from_config(run_config.DeepSea, FLAGS.config)
  cli.record(FLAGS.out_dir, "deepsea", FLAGS.config)
  if config.num_seeds > 1:
    for summary in train_seeds(
        config,
        FLAGS.out_dir,
        checkpoint_dir=FLAGS.checkpoint_dir,
        tensorboard=FLAGS.tensorboard,
        mesh=FLAGS.mesh,
    ):
      print(records.headline(summary))
    return
  summary = train(
      config,
      FLAGS.out_dir,
      checkpoint_dir=FLAGS.checkpoint_dir,
      tensorboard=FLAGS.tensorboard,
      mesh=FLAGS.mesh,
  )
  print(records.headline(summary))


if __name__ == "__main__":
  define_flags()
  cli.run(main)
