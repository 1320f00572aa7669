"""TensorBoard scalar events written without TensorFlow.

``tensorboard.summary.Writer`` opens its event file through ``tf.io.gfile``, and
``tensorboard.compat.tf`` imports the real TensorFlow whenever it is installed (neural-tangents
pulls it in): ~8 s, ~1 GB and, through TensorFlow's own imports, scipy's OpenBLAS, whose fork
handler deadlocks ViZDoom's parallel game start-up (see
``rl.game_guard.quiesce_blas_thread_pools``).
This writer produces the same files (TFRecord-framed ``Event`` protos with the scalars plugin's
metadata) from the ``tensorboard`` package's TF-free pieces: its protos and ``RecordWriter``.
"""

from __future__ import annotations

import itertools
import os
import socket
import time
from pathlib import Path

from tensorboard.compat.proto import event_pb2
from tensorboard.compat.proto import summary_pb2
from tensorboard.compat.proto import tensor_pb2
from tensorboard.compat.proto import tensor_shape_pb2
from tensorboard.compat.proto import types_pb2
from tensorboard.plugins.scalar import metadata as scalar_metadata
from tensorboard.summary.writer.record_writer import RecordWriter

_file_ids = itertools.count()


class ScalarWriter:
  """Appends scalar summaries to a new ``events.out.tfevents.*`` file in ``logdir``.

  Writes are synchronous (a few scalars per log line): ``flush`` makes them visible to a
  running TensorBoard, ``close`` ends the file.
  """

  def __init__(self, logdir: str | os.PathLike):
    self._metadata = summary_pb2.SummaryMetadata(
        plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name=scalar_metadata.PLUGIN_NAME),
        data_class=summary_pb2.DataClass.DATA_CLASS_SCALAR,
    )
    Path(logdir).mkdir(parents=True, exist_ok=True)
    # the name TensorBoard's own writer uses: time, host, pid, a per-process counter
    self.path = Path(logdir) / (
        f"events.out.tfevents.{int(time.time()):010d}."
        f"{socket.gethostname()}.{os.getpid()}.{next(_file_ids)}"
    )
    self._records = RecordWriter(open(self.path, "wb"))
    self._write(event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2"))
    self.flush()

  def _write(self, event) -> None:
    self._records.write(event.SerializeToString())

  def add_scalar(self, tag: str, value: float, step: int) -> None:
    """One float32 scalar ``value`` of series ``tag`` at ``step``."""
    tensor = tensor_pb2.TensorProto(
        dtype=types_pb2.DT_FLOAT,
        float_val=[float(value)],
        tensor_shape=tensor_shape_pb2.TensorShapeProto(),
    )
    event = event_pb2.Event(wall_time=time.time(), step=int(step))
    event.summary.value.add(tag=tag, tensor=tensor, metadata=self._metadata)
    self._write(event)

  def flush(self) -> None:
    self._records.flush()

  def close(self) -> None:
    if not self._records.closed:
      self._records.close()
