"""How a binary scales out: the flags for the device mesh and JAX's multi-process runtime.

Every binary with a training loop calls ``define_flags()`` from its own ``define_flags()`` and
``setup()`` first thing in ``main``::

    --mesh=data=8                         data-parallel over 8 devices ('' = one device)
    --distributed                         jax.distributed.initialize() from the cluster's
                                          environment (SLURM, TPU pod metadata, ...)
    --coordinator_address=host:1234 --num_processes=2 --process_id=0
                                          a launch by hand (implies --distributed)

``setup()`` joins the multi-process run (``parallel.initialize_distributed``) *before* anything
touches a device, then builds the mesh over all processes' devices. There is no other
communication code: ``jax.jit`` inserts the collectives (``csd_jax.parallel``).
"""

from __future__ import annotations

from absl import flags

from cmdline import flag_checks

FLAGS = flags.FLAGS


def define_flags() -> None:
  """Defines --mesh, --distributed, --coordinator_address, --num_processes, --process_id."""
  flags.DEFINE_string(
      "mesh",
      "",
      "Data-parallel over a jax.sharding.Mesh, e.g. 'data=8': each "
      "step's batch is sharded over the 'data' axis, params replicated (batch "
      "sizes must divide evenly). '' = one device. Multi-host: BUILD.md.",
  )
  flags.DEFINE_bool(
      "distributed",
      False,
      "Join a multi-process run with "
      "jax.distributed.initialize() (cluster environment, or the three flags "
      "below) before building the mesh.",
  )
  flags.DEFINE_string(
      "coordinator_address",
      None,
      "Multi-process: host:port of process 0 " "(implies --distributed).",
  )
  flags.DEFINE_integer("num_processes", None, "Multi-process: number of processes.")
  flags.DEFINE_integer("process_id", None, "Multi-process: this process's index.")
  flag_checks.positive("num_processes")
  flag_checks.non_negative("process_id")
  flag_checks.requires(
      "coordinator_address",
      lambda v: v["num_processes"] is not None
      and v["process_id"] is not None
      and v["process_id"] < v["num_processes"],
      "--coordinator_address needs --num_processes and --process_id < --num_processes",
      ["num_processes", "process_id"],
  )
  # The devices of a multi-process run are only known after initialize: then the mesh's
  # syntax is checked at parse time, its size in setup().
  flag_checks.mesh("mesh", distributed_flags=("distributed", "coordinator_address"))


def _wants_distributed() -> bool:
  return bool(FLAGS.distributed or FLAGS.coordinator_address)


def setup():
  """Joins the distributed runtime if asked, then returns the ``--mesh`` (None for '')."""
  from csd_jax import parallel

  if _wants_distributed():
    parallel.initialize_distributed(
        FLAGS.coordinator_address, FLAGS.num_processes, FLAGS.process_id
    )
  return parallel.make_mesh(FLAGS.mesh) if FLAGS.mesh else None
