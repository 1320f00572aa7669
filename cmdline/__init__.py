"""The command line of every binary (OOD kit, RL, validation): one ``--config`` per binary and
its checks (``cli``), up-front flag checks and the run's flagfile (``flag_checks``), and the
device-mesh and multi-process flags (``launch``)."""
