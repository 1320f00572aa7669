"""Experiment configs of the binaries (flax-examples style): ``<binary>.py`` defines
``get_config(arg=None) -> ml_collections.ConfigDict``; select one with ``--config=configs/x.py``
(``:arg`` for a named profile) and override fields with ``--config.<field>=value``."""
