"""The PyTorch track: process group on every engine, collectives support, training helpers.

Modules: :mod:`.process_group` (backend choice, start/stop with timeouts; unit 0),
:mod:`.collectives` (ring chunking, byte accounting, algbw/busbw, timing; unit 1),
:mod:`.train` (models, reference SGD, metrics; units 2-3). The kernel side never imports torch;
the ``engine_*``/``_engine_*`` functions import it on the engines.
"""

from __future__ import annotations

from .process_group import BACKENDS, choose_backend, pg_backend, start, stop

__all__ = ["BACKENDS", "choose_backend", "pg_backend", "start", "stop"]
