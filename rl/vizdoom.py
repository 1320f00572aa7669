r"""Train one DQN-family agent on VizDoom MyWayHome (envpool), stepping the envs from Python;
resumable.

    python -m rl.vizdoom --config=configs/vizdoom.py:csd_sa --config.variant=sparse \
        --out_dir=/tmp/doom_csd_sa

Agents and outputs as ``rl.deepsea`` (``vizdoom.flags`` and ``vizdoom.config.json`` here); the
config is ``configs/vizdoom.py``, whose profile ``agent,setting`` also picks the view (``paper``:
42x42 gray, 6 frames, no frame skip; ``cpu``: the same with frame skip 4 and small nets;
``nature``: 84x84 RGB) and the actions (``pixels.actions``: the 5 single buttons in ``paper``
and ``cpu``, envpool's 18 combinations in ``nature``). ``sps`` in the summary times the env
steps after the first update (learning included), ``updates`` counts the learner's updates.
Each vectorised env step runs on the host (envpool), then the jitted ``rl.dqn.observe``
(replay write, next actions) and ``rl.dqn.learn`` (the updates, dispatched asynchronously so
the next env step overlaps them).

Every env call (the start included) runs under a watchdog (``rl.doom_env.start_doom``): an env
that fails or hangs past ``config.env_timeout_s`` checkpoints the run and stops it with one error
naming the env (``exit_on_env_failure``); a rerun resumes. envpool's state cannot be saved: a
resumed run resets its envs and marks the last stored transition invalid.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags

from csd_jax import parallel
from rl import agents
from rl import doom_env
from rl import dqn
from rl import dqn_config
from rl import game_guard
from rl import networks
from rl import records
from rl import replay as replay_lib
from rl import run_config
from rl import startup
from rl import watchdog
from cmdline import cli

FLAGS = flags.FLAGS


def pixels(config: run_config.VizDoom) -> doom_env.DoomPixels:
  """The observation, frame skip and action set of ``config.pixels``."""
  return doom_env.DoomPixels(**dataclasses.asdict(config.pixels))


def learner_config(config: run_config.VizDoom, mesh=None) -> dqn_config.Config:
  """The learner of ``config``: conv Q-nets of ``config.dqn`` (one torso shared by all heads;
  with ``dqn.residual``, IMPALA stages of the convs' channels) on the uint8 frame stacks,
  ``pixels.actions`` actions. The linear-CSD prior and the RND nets of the next-observation
  bonuses are the plain conv torso; the state-action bonuses' nets are their own
  (``csd.convs`` / ``rnd.convs``; on pooled, flattened frames, MLPs)."""
  d = config.dqn
  agent = agents.AGENTS[config.agent]
  plain = networks.conv_spec(d.convs, d.padding, d.widths, 1)
  q_spec = (
      networks.ImpalaSpec(tuple(c[0] for c in d.convs), d.widths, 1, d.spectral_norm)
      if d.residual
      else plain
  )
  bonus_spec = towers = None
  if agent.bonus == "csd" and not agent.state_action:
    width = config.csd.prior_width or plain.widths[-1]
    bonus_spec = dataclasses.replace(
        plain, widths=(*plain.widths[:-1], width), parameterization="ntk"
    )
  elif agent.bonus == "rnd" and not agent.state_action:
    bonus_spec = plain
  elif agent.deep_csd:
    c = config.csd
    bonus_spec = networks.conv_spec(c.convs, "SAME", (c.prior_width,), 1, "ntk")  # as DeepSea's
    towers = networks.conv_spec(c.convs, "SAME", c.tower_widths, 1)
  elif agent.bonus == "rnd":
    bonus_spec = networks.conv_spec(config.rnd.convs, "SAME", config.rnd.widths, 1)
  return run_config.learner(
      config,
      obs_shape=pixels(config).obs_shape,
      num_actions=config.pixels.actions,
      q_spec=q_spec,
      bonus_spec=bonus_spec,
      shared_torso=True,
      mesh=mesh,
      csd_towers=towers,
  )


def resolve_setting(config: cli.ConfigDict) -> cli.ConfigDict:
  """``config``, or where its profile left the setting to JAX (``setting == rl.agents.AUTO``),
  the profile rebuilt with ``configs/vizdoom.py``'s ``default_setting()`` and the command
  line's ``--config.`` overrides. Call after ``rl.startup.setup()``: a multi-process run may
  query JAX's backend only after ``jax.distributed.initialize``."""
  if config.setting != agents.AUTO:
    return config
  run_config.check_agent(config)  # config.agent is its profile's (no --config.agent override)
  from configs import vizdoom as vizdoom_configs  # pylint: disable=g-import-not-at-top

  setting = vizdoom_configs.default_setting()
  config = cli.reload_config(f"{config.agent},{setting}")
  if (
      config.setting == agents.AUTO
  ):  # --config.setting=auto on the command line: the label decided too
    config.setting = setting
  return config


def train(
    config: run_config.VizDoom,
    out_dir: str,
    *,
    checkpoint_dir: str | None = None,
    tensorboard: bool = True,
    mesh: str = "",
    verbose: bool = True,
) -> dict:
  """Runs (or resumes) one training run; returns the summary (also in OUT_DIR/summary.json).

  The env is closed (its games ended) on every way out but a hung env, which the caller
  should end with ``exit_on_env_failure`` (see ``rl.watchdog.Watchdog``). ``config``: a checked
  run (``rl.run_config.from_config``).
  """
  cfg = learner_config(config, parallel.make_mesh(mesh) if mesh else None)
  run = records.Run(
      config,
      out_dir,
      num_envs=cfg.num_envs,
      checkpoint_dir=checkpoint_dir,
      tensorboard=tensorboard,
      verbose=verbose,
      epsilon=lambda step: float(dqn.epsilon(cfg, jnp.asarray(step))),
      label=f"{config.agent} doom_{config.variant} seed {config.seed}",
  )
  env = None
  try:
    # A private working folder for ViZDoom's _vizdoom* files (parallel starts race on them).
    env = doom_env.start_doom(
        config.variant,
        cfg.num_envs,
        config.seed,
        timeout_s=config.env_timeout_s,
        work_dir=run.out_dir / "vizdoom",
        pixels=pixels(config),
    )
    return _train(config, cfg, run, env)
  finally:
    run.close()
    if env is not None and not env.hung:
      env.close()


def _train(config: run_config.VizDoom, cfg: dqn_config.Config, run: records.Run, env) -> dict:
  """``train`` with its env started."""
  # Agent (the second key, as in rl.deepsea; envpool seeds the envs from config.seed).
  _, k_agent = jax.random.split(jax.random.PRNGKey(config.seed))
  if env.num_actions != cfg.num_actions:
    raise ValueError(
        f"{env.env_id} has {env.num_actions} actions, the learner "
        f"{cfg.num_actions} (config.pixels.actions)"
    )
  env_sps = doom_env.measure_steps_per_second(env, max(1, 400 // cfg.num_envs), seed=config.seed)
  obs, _ = env.reset()
  obs = jnp.asarray(obs)
  agent = dqn.init(cfg, k_agent, obs)
  agent, actions = dqn.first_actions(cfg, agent, obs)
  restored = run.restore(dict(agent=agent))
  if restored is not None:  # new episodes (envpool restarted): drop the dangling transition
    agent = restored["agent"]
    agent = agent._replace(replay=replay_lib.invalidate_last(agent.replay))
    agent, actions = dqn.first_actions(cfg, agent, obs)
    run.episodes.running[:] = 0.0
  if cfg.mesh is not None:  # params and replay on every device of the mesh
    agent = parallel.replicate(cfg.mesh, agent)

  observe = jax.jit(functools.partial(dqn.observe, cfg), donate_argnums=0)
  # Readiness decided on the host (a static argument): dqn.learn says why.
  learn = jax.jit(functools.partial(dqn.learn, cfg), static_argnums=1, donate_argnums=0)
  ready_to_learn = jax.jit(functools.partial(dqn.ready_to_learn, cfg))

  # Train: one vectorised env step, then observe and learn, until a stop rule holds.
  now = int(agent.env_steps)
  run.start(now)
  learning = False
  while not run.should_stop(now):
    before = now
    try:
      out = env.step(np.asarray(actions))
    except watchdog.EnvFailure as e:  # keep what was learned, then stop (never hang)
      run.save(dict(agent=agent), before)
      raise watchdog.EnvFailure(
          f"{e}; stopped at env step {before}, checkpoint saved in {run.manager.directory}: "
          "rerun with the same config to resume"
      ) from e
    next_obs = jnp.asarray(out.obs)
    agent, actions = observe(
        agent,
        obs,
        actions,
        next_obs,
        jnp.asarray(out.reward),
        jnp.asarray(out.done),
        jnp.asarray(out.info["terminated"]),
        jnp.asarray(out.valid),
    )
    ready = bool(ready_to_learn(agent))
    agent, metrics = learn(agent, ready)  # overlaps the next env.step
    if ready and not learning:  # the first update compiled: sps times the learning steps
      learning = True
      run.restart_timing()
    obs = next_obs
    now = before + cfg.num_envs
    run.episodes.add_rows(
        before, out.reward[None], out.done[None], out.success[None], out.valid[None]
    )
    if run.log_due(now):  # fetching the metrics waits for the update: only when logging
      metrics = jax.device_get(metrics)
      if metrics["updated"] > 0:
        run.add_metrics({k: metrics[k] for k in dqn.metric_names(cfg)})
    run.after_steps(before, now, dict(agent=agent), env_sps=env_sps)

  return run.finish(
      dict(agent=agent),
      now,
      env_sps=env_sps,
      title=f"{config.agent} on doom_{config.variant}, seed {config.seed}",
      env=f"doom_{config.variant}",
      agent=config.agent,
      seed=config.seed,
      variant=config.variant,
      setting=config.setting,
      updates=int(agent.learner.updates),
  )


def exit_on_env_failure(binary: str, fn: Callable[[], Any]) -> Any:
  """``fn()``; an ``EnvFailure`` ends the process with one line and status 1, an interrupt
  propagates. Either way this process's ViZDoom games are killed first, so none outlives it."""
  try:
    return fn()
  except watchdog.EnvFailure as e:
    print(f"{binary}: {e}", file=sys.stderr, flush=True)
    game_guard.kill_all_games()
    os._exit(1)  # not sys.exit: a hung env thread would block the interpreter's exit
  except KeyboardInterrupt:
    game_guard.kill_all_games()
    raise


def define_flags() -> None:
  """``--config`` (configs/vizdoom.py) and where the run writes; called under ``__main__``
  only, never at import (tests/test_binaries.py says why)."""
  cli.define_config("vizdoom")
  startup.define_flags("/tmp/csd_rl")


def main(argv):
  del argv
  startup.setup()
  resolved = resolve_setting(FLAGS.config)
  config = run_config.from_config(run_config.VizDoom, resolved)
  cli.record(FLAGS.out_dir, "vizdoom", resolved)
  summary = exit_on_env_failure(
      "rl.vizdoom",
      lambda: train(
          config,
          FLAGS.out_dir,
          checkpoint_dir=FLAGS.checkpoint_dir,
          tensorboard=FLAGS.tensorboard,
          mesh=FLAGS.mesh,
      ),
  )
  print(records.headline(summary))


if __name__ == "__main__":
  define_flags()
  cli.run(main)
