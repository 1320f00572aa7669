"""Data parallelism on JAX's own runtime: a ``jax.sharding.Mesh`` over the devices.

The training loops shard the batch axis over the mesh axis ``"data"`` and replicate
parameters; ``jax.jit`` (GSPMD) inserts the collectives. Multi-host runs call
``initialize_distributed`` first (``jax.distributed.initialize``); the mesh then spans
the devices of all processes. No hand-written communication.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

DATA_AXIS = "data"


def parse_mesh(spec: str | None) -> dict[str, int]:
  """Parses ``"data=8"`` (or ``""``/None for all devices on one data axis)."""
  if not spec:
    return {DATA_AXIS: jax.device_count()}
  axes = {}
  for part in spec.split(","):
    name, _, size = part.partition("=")
    if not size.strip().isdigit() or int(size) < 1:
      raise ValueError(f"mesh must look like 'data=8', got {spec!r}")
    axes[name.strip()] = int(size)
  if DATA_AXIS not in axes:
    raise ValueError(f"mesh needs a '{DATA_AXIS}' axis, got {spec!r}")
  return axes


def make_mesh(spec: str | None = None, devices=None) -> Mesh:
  """A mesh over ``devices`` (default: all, across processes) shaped by ``spec``."""
  axes = parse_mesh(spec)
  devices = jax.devices() if devices is None else list(devices)
  size = int(np.prod(list(axes.values())))
  if size > len(devices):
    raise ValueError(f"mesh {axes} needs {size} devices, only {len(devices)} visible")
  grid = np.asarray(devices[:size]).reshape(tuple(axes.values()))
  return Mesh(grid, tuple(axes))


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Shards the leading (batch) axis over ``"data"``."""
  return NamedSharding(mesh, P(DATA_AXIS))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def replicate(mesh: Mesh, tree: Any) -> Any:
  """Places every leaf of ``tree`` on all devices of ``mesh``."""
  return jax.device_put(tree, replicated(mesh))


def constrain_batch(mesh: Mesh | None, tree: Any) -> Any:
  """Inside jit: asks GSPMD to keep ``tree`` sharded over the batch axis."""
  if mesh is None:
    return tree
  return jax.lax.with_sharding_constraint(tree, batch_sharding(mesh))


def initialize_distributed(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
) -> None:
  """Joins a multi-process run via ``jax.distributed.initialize``.

  With no arguments, JAX reads the cluster's environment (SLURM, TPU pod metadata,
  ``JAX_COORDINATOR_ADDRESS`` …); pass all three for a manual launch.
  """
  # CPU devices exchange collectives through gloo (the default CPU backend has none); this
  # touches only the CPU backend, so GPU / TPU runs are unaffected.
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(
      coordinator_address=coordinator_address, num_processes=num_processes, process_id=process_id
  )
